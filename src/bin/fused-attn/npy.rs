//! Minimal .npy (format 1.0) writer for `--dump`: little-endian, C order.

use std::io::Write;
use std::path::Path;

use fused_attn::{Error, Result};

/// Element encodings the dumps use: float16 as '<f2', bf16 exactly widened to '<f4', and the integer tables.
pub enum NpyData<'a> {
    F16(Vec<half::f16>),
    F32(Vec<f32>),
    I32(&'a [i32]),
}

pub fn write(path: &Path, shape: &[usize], data: NpyData<'_>) -> Result<()> {
    let (descr, bytes): (&str, Vec<u8>) = match data {
        NpyData::F16(d) => ("<f2", d.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()),
        NpyData::F32(d) => ("<f4", d.iter().flat_map(|x| x.to_le_bytes()).collect()),
        NpyData::I32(d) => ("<i4", d.iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Magic (6) + version (2) + header length (2) + header, padded with spaces and a newline to 64 bytes.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + bytes.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&bytes);
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(&out))
        .map_err(|e| Error::usage(format!("--dump: cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_64_byte_aligned_and_parsable() {
        let dir = std::env::temp_dir().join(format!("fa-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.npy");
        write(&p, &[2, 3], NpyData::I32(&[1, 2, 3, 4, 5, 6])).unwrap();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(&b[..6], b"\x93NUMPY");
        let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 3)") && header.ends_with('\n'));
        assert_eq!(b.len(), 10 + hlen + 24);
        assert_eq!(i32::from_le_bytes(b[10 + hlen..14 + hlen].try_into().unwrap()), 1);
    }
}
