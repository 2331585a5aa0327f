//! GGUF files (llama.cpp's format) as people download them: the reader
//! that checks a file before anything is allocated from it (`reader`),
//! mapped files and split models as one tensor table (`file`), metadata
//! values (`meta`), ggml's tensor types (`types`) and their block formats
//! (`blocks`: dequantization and dot products), a small writer for tests
//! and tools (`writer`).

pub mod blocks;
pub mod file;
pub mod meta;
pub mod reader;
pub mod types;
pub mod writer;

pub use blocks::BlockFormat;
pub use file::{GgufFile, GgufModel, GgufTensor};
pub use meta::{Array, Metadata, Value};
pub use reader::{parse, Header, TensorInfo};
pub use types::GgmlType;
pub use writer::GgufWriter;
