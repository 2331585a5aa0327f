//! GGUF: the reader on the fixtures of `tools/make_gguf_fixtures.py`,
//! every supported block format dequantized bit for bit as gguf-py does,
//! dot products against dequantize-then-f64, and split models.

use moeflux::format::gguf::{parse, BlockFormat, GgmlType, GgufModel, GgufWriter, Value};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

/// The reference file: gguf-py's dequantization of every tensor, as F32.
fn reference() -> Vec<u8> {
    let xz = std::fs::read(fixture("blocks_ref.gguf.xz")).unwrap();
    let mut out = Vec::new();
    lzma_rs::xz_decompress(&mut &xz[..], &mut out).unwrap();
    out
}

#[test]
fn every_supported_type_dequantizes_as_gguf_py() {
    let model = GgufModel::open(&fixture("blocks.gguf")).unwrap();
    let ref_bytes = reference();
    let refs = parse(&ref_bytes, Path::new("blocks_ref.gguf")).unwrap();
    let mut seen = vec![];
    for t in &model.tensors {
        let info = &t.info;
        let r = refs.tensors.iter().find(|r| r.name == info.name).unwrap();
        assert_eq!((r.ty, &r.dims), (GgmlType::F32, &info.dims), "{}", info.name);
        assert_eq!(info.row_len(), 2048);
        let want: Vec<f32> = ref_bytes[r.offset..r.offset + r.size]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let f = BlockFormat::new(info.ty).unwrap();
        let data = model.data(t);
        for row in 0..info.rows() {
            let bytes = &data[row * info.row_bytes()..(row + 1) * info.row_bytes()];
            let mut got = vec![0.0f32; 2048];
            f.dequantize_row(bytes, &mut got);
            for (i, (g, w)) in got.iter().zip(&want[row * 2048..]).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{} row {row} value {i}: {g} vs {w}",
                    info.name
                );
            }
        }
        seen.push(info.ty);
    }
    for ty in GgmlType::SUPPORTED {
        assert!(seen.contains(&ty), "no fixture for {ty}");
    }
}

#[test]
fn dot_products_match_dequantize_then_f64() {
    let model = GgufModel::open(&fixture("blocks.gguf")).unwrap();
    for t in &model.tensors {
        let info = &t.info;
        let f = BlockFormat::new(info.ty).unwrap();
        let data = model.data(t);
        let x: Vec<f32> = (0..2048)
            .map(|i| ((i * 7919 % 1001) as f32 / 500.0 - 1.0) * 0.7)
            .collect();
        for row in 0..info.rows() {
            let bytes = &data[row * info.row_bytes()..(row + 1) * info.row_bytes()];
            let mut w = vec![0.0f32; 2048];
            f.dequantize_row(bytes, &mut w);
            let want: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = w.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let got = f.dot(bytes, &x) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * scale + 1e-30,
                "{} row {row}: {got} vs {want} (scale {scale})",
                info.name
            );
        }
    }
}

#[test]
fn float_rows_of_any_length_dequantize_and_dot() {
    // 13 values: the 8-wide kernel and a tail of 5.
    let vals: Vec<f32> = (0..13).map(|i| i as f32 * 0.25 - 1.0).collect();
    let x: Vec<f32> = (0..13).map(|i| 1.0 + i as f32).collect();
    let want: f32 = vals.iter().zip(&x).map(|(a, b)| a * b).sum();
    for (ty, bytes) in [
        (
            GgmlType::F32,
            vals.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        ),
        (
            GgmlType::F16,
            vals.iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        (
            GgmlType::Bf16,
            vals.iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
    ] {
        let f = BlockFormat::new(ty).unwrap();
        let mut out = vec![0.0; 13];
        f.dequantize_row(&bytes, &mut out);
        assert_eq!(out, vals, "{ty}");
        assert!((f.dot(&bytes, &x) - want).abs() < 1e-4, "{ty}");
    }
}

#[test]
fn unsupported_types_are_named_with_the_tensor() {
    assert!(BlockFormat::new(GgmlType::Iq2Xxs).is_none());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::Str("qwen3moe".into()));
    w.tensor(
        "blk.0.ffn_down_exps.weight",
        &[256, 2],
        GgmlType::Iq2Xxs,
        vec![0; 2 * 66],
    );
    std::fs::write(&path, w.to_bytes()).unwrap();
    let m = GgufModel::open(&path).unwrap();
    let err = m.supported("blk.0.ffn_down_exps.weight").unwrap_err().to_string();
    for part in ["m.gguf", "blk.0.ffn_down_exps.weight", "IQ2_XXS", "--requantize"] {
        assert!(err.contains(part), "{err}");
    }
}

/// A split model: three parts beside each other, one table.
#[test]
fn split_models_open_from_the_first_part() {
    let dir = tempfile::tempdir().unwrap();
    let part = |no: u16, names: &[&str]| {
        let mut w = GgufWriter::new();
        w.kv("general.architecture", Value::Str("qwen3moe".into()));
        w.kv("split.no", Value::U16(no));
        w.kv("split.count", Value::U16(3));
        w.kv("split.tensors.count", Value::I32(4));
        for (i, n) in names.iter().enumerate() {
            w.tensor(n, &[32, 1], GgmlType::Q8_0, vec![no as u8 + i as u8; 34]);
        }
        std::fs::write(dir.path().join(format!("m-{:05}-of-00003.gguf", no + 1)), w.to_bytes()).unwrap();
    };
    part(0, &["a", "b"]);
    part(1, &["c"]);
    part(2, &["d"]);
    let m = GgufModel::open(&dir.path().join("m-00001-of-00003.gguf")).unwrap();
    assert_eq!(m.parts.len(), 3);
    let names: Vec<&str> = m.tensors.iter().map(|t| t.info.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert_eq!(m.data(m.get("c").unwrap())[0], 1);
    assert_eq!(m.region(m.get("d").unwrap()).bytes()[5], 2);
    // Not the first part, a missing part, a duplicate across parts.
    let err = GgufModel::open(&dir.path().join("m-00002-of-00003.gguf"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("split.no"), "{err}");
    part(2, &["a"]);
    let err = GgufModel::open(&dir.path().join("m-00001-of-00003.gguf"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("`a`"), "{err}");
    std::fs::remove_file(dir.path().join("m-00003-of-00003.gguf")).unwrap();
    let err = GgufModel::open(&dir.path().join("m-00001-of-00003.gguf"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("m-00003-of-00003.gguf"), "{err}");
}

/// Each malformed header is refused with a message naming what is wrong.
#[test]
fn malformed_headers_are_refused_by_name() {
    let good = || {
        let mut w = GgufWriter::new();
        w.kv("general.architecture", Value::Str("x".into()));
        w.tensor("t", &[32, 2], GgmlType::Q4_0, vec![0; 36]);
        w
    };
    let p = Path::new("bad.gguf");
    let err = |b: &[u8]| parse(b, p).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(parse(&good().to_bytes(), p).is_ok());

    let mut b = good().to_bytes();
    b[0] = b'X';
    assert!(err(&b).contains("not a GGUF file"));
    let mut b = good().to_bytes();
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(err(&b).contains("version 1"));
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err(&b).contains("big-endian"));
    let b = good().to_bytes();
    assert!(err(&b[..b.len() - 40]).contains("tensor `t`"));
    let mut w = good();
    w.kv("general.architecture", Value::Str("y".into()));
    assert!(err(&w.to_bytes()).contains("`general.architecture` appears twice"));
    let mut w = good();
    w.tensor("t", &[32], GgmlType::Q4_0, vec![0; 18]);
    assert!(err(&w.to_bytes()).contains("tensor `t` appears twice"));
    let mut w = good();
    w.tensor("u", &[33], GgmlType::Q4_0, vec![0; 18]);
    assert!(err(&w.to_bytes()).contains("whole Q4_0 blocks"));
    let mut w = good();
    w.kv("general.alignment", Value::U32(24));
    assert!(err(&w.to_bytes()).contains("general.alignment"));
    // An unknown value type: patch the type of the only key.
    let mut b = good().to_bytes();
    let at = 24 + 8 + "general.architecture".len();
    b[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(err(&b).contains("unknown value type 13"));
    // A huge string length.
    let mut b = good().to_bytes();
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(&b).contains("exceeds the limit"));
}

#[test]
fn alignment_and_metadata_types_round_trip() {
    let mut w = GgufWriter::new();
    w.kv("general.alignment", Value::U32(64));
    w.kv("a.list", Value::Array(moeflux::format::gguf::Array::I32(vec![3, 3, 3])));
    w.kv("a.f", Value::F32(0.5));
    w.tensor("x", &[8, 3], GgmlType::F32, vec![1; 96]);
    w.tensor("y", &[64], GgmlType::F16, vec![2; 128]);
    let h = parse(&w.to_bytes(), Path::new("a.gguf")).unwrap();
    assert_eq!(h.alignment, 64);
    assert!(h.tensors.iter().all(|t| t.offset % 64 == 0));
    assert_eq!(h.tensors[0].shape(), [3, 8]);
    assert_eq!(h.meta.uniform_uint_opt("a.list").unwrap(), Some(3));
    assert_eq!(h.meta.num_opt("a.f").unwrap(), Some(0.5));
}
