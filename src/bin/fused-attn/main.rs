//! fused-attn runner: `report` (the standard sweep) and `run` (one configuration).
mod args;
mod npy;
mod plot;
mod row;

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match args::parse(argv) {
        Ok(a) => println!("{a:?}"),
        Err(e) => {
            eprintln!("fused-attn: {}", e.message());
            std::process::exit(2);
        }
    }
}
