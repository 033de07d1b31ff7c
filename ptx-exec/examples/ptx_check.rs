//! Decodes every kernel of the PTX files given on the command line and prints what it cannot model.
fn main() {
    for path in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&path).unwrap();
        match ptx_exec::Module::parse(&text) {
            Ok(m) => println!("{path}: {} kernels decoded", m.kernel_names().count()),
            Err(e) => println!("{path}: {e}"),
        }
    }
}
