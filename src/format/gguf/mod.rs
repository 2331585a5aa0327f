//! GGUF files (llama.cpp's format) as people download them: the reader
//! that checks a file before anything is allocated from it (`reader`),
//! mapped files and split models as one tensor table (`file`), metadata
//! values (`meta`), the metadata as a Hugging Face `config.json`
//! (`config`), GGUF tensor names as packed names (`names`), the
//! tokenizer, chat template and generation defaults (`tokenizer`), ggml's tensor types (`types`) and their block formats
//! (`blocks`: dequantization and dot products), a small writer for tests
//! and tools (`writer`).

pub mod blocks;
pub mod config;
pub mod file;
pub mod meta;
pub mod names;
pub mod reader;
pub mod tokenizer;
pub mod types;
pub mod writer;

pub use blocks::BlockFormat;
pub use config::hf_config;
pub use file::{GgufFile, GgufModel, GgufTensor};
pub use meta::{Array, Metadata, Value};
pub use names::{packed_name, ExpertProj, Mapped};
pub use reader::{parse, Header, TensorInfo};
pub use tokenizer::{chat_template, generation_config, tokenizer_config, tokenizer_json};
pub use types::GgmlType;
pub use writer::GgufWriter;
