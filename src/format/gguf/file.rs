//! Opening GGUF files: one memory-mapped file ([`GgufFile`]), and a model
//! that may be split over several (`NAME-00001-of-00003.gguf`, keys
//! `split.no` / `split.count`) presented as one tensor table
//! ([`GgufModel`]).

use super::meta::Metadata;
use super::reader::{parse, Header, TensorInfo};
use super::types::GgmlType;
use crate::error::{Error, Result};
use crate::format::Region;
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Parts of a split model.
const MAX_SPLITS: usize = 1000;

/// One opened, memory-mapped GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    map: Arc<Mmap>,
    pub header: Header,
}

impl GgufFile {
    /// Map `path` and check its header (see `reader`).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only and only read; a file changed
        // by another process while it is mapped is outside what we can guard
        // against (as for safetensors checkpoints).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let header = parse(&map, path)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            map: Arc::new(map),
            header,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// A tensor of a (possibly split) model: its info and the part it is in.
#[derive(Debug, Clone)]
pub struct GgufTensor {
    pub info: TensorInfo,
    /// Index into [`GgufModel::parts`].
    pub part: usize,
}

/// A GGUF model: the metadata of its first file and the tensors of all its
/// parts.
pub struct GgufModel {
    pub parts: Vec<GgufFile>,
    /// In file order, part after part.
    pub tensors: Vec<GgufTensor>,
    index: HashMap<String, usize>,
}

/// `(prefix, count)` of a split file name `PREFIX-00001-of-0000N.gguf`.
fn split_name(path: &Path) -> Option<(String, usize, usize)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, n) = stem.rsplit_once("-of-")?;
    let (prefix, i) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(i) && digits(n)).then(|| Some((prefix.to_string(), i.parse().ok()?, n.parse().ok()?)))?
}

impl GgufModel {
    /// Open a GGUF file; for the first part of a split model, every part
    /// (found beside it by the split naming scheme).
    pub fn open(path: &Path) -> Result<GgufModel> {
        let first = GgufFile::open(path)?;
        let meta = &first.header.meta;
        let count = meta.uint_opt("split.count")?.unwrap_or(1);
        let no = meta.uint_opt("split.no")?.unwrap_or(0);
        if count == 0 || count > MAX_SPLITS {
            return Err(meta.error("split.count", format!("{count}: expected 1 to {MAX_SPLITS}")));
        }
        if no != 0 {
            return Err(meta.error(
                "split.no",
                format!(
                    "{no}: this is part {} of {count}; open the first part (…-00001-of-{count:05}.gguf)",
                    no + 1
                ),
            ));
        }
        let mut parts = vec![first];
        if count > 1 {
            let Some((prefix, 1, n)) = split_name(path).filter(|s| s.2 == count) else {
                return Err(Error::format(
                    path,
                    format!("split.count is {count}, but the name is not PREFIX-00001-of-{count:05}.gguf"),
                ));
            };
            let dir = path.parent().unwrap_or(Path::new("."));
            for i in 2..=n {
                let p = dir.join(format!("{prefix}-{i:05}-of-{n:05}.gguf"));
                let part = GgufFile::open(&p)?;
                let m = &part.header.meta;
                if m.uint_opt("split.no")? != Some(i - 1) || m.uint_opt("split.count")? != Some(count) {
                    return Err(Error::format(
                        &p,
                        format!("expected split.no {} and split.count {count}", i - 1),
                    ));
                }
                parts.push(part);
            }
        }
        let mut tensors = Vec::new();
        let mut index = HashMap::new();
        for (pi, part) in parts.iter().enumerate() {
            for t in &part.header.tensors {
                if index.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(Error::format(
                        &part.path,
                        format!("tensor `{}` is also in an earlier part", t.name),
                    ));
                }
                tensors.push(GgufTensor {
                    info: t.clone(),
                    part: pi,
                });
            }
        }
        if let Some(total) = parts[0].header.meta.uint_opt("split.tensors.count")? {
            if total != tensors.len() {
                return Err(parts[0].header.meta.error(
                    "split.tensors.count",
                    format!("{total}, but the parts hold {} tensors", tensors.len()),
                ));
            }
        }
        Ok(GgufModel { parts, tensors, index })
    }

    /// The first file's path.
    pub fn path(&self) -> &Path {
        &self.parts[0].path
    }

    /// The metadata (the first file's; llama.cpp reads only that one).
    pub fn meta(&self) -> &Metadata {
        &self.parts[0].header.meta
    }

    pub fn get(&self, name: &str) -> Option<&GgufTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor by name, or an error naming it and the file.
    pub fn tensor(&self, name: &str) -> Result<&GgufTensor> {
        self.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            where_: Some(self.path().display().to_string()),
        })
    }

    /// The bytes of a tensor.
    pub fn data(&self, t: &GgufTensor) -> &[u8] {
        &self.parts[t.part].bytes()[t.info.offset..t.info.offset + t.info.size]
    }

    /// The bytes of a tensor as a shared region of its file's map.
    pub fn region(&self, t: &GgufTensor) -> Region {
        let map: Arc<dyn AsRef<[u8]> + Send + Sync> = self.parts[t.part].map.clone();
        Region::new(map, t.info.offset, t.info.size)
    }

    /// A tensor whose type moeflux computes with, or the error that names
    /// its type and suggests requantizing.
    pub fn supported(&self, name: &str) -> Result<&GgufTensor> {
        let t = self.tensor(name)?;
        check_supported(self.parts[t.part].path.as_path(), &t.info)?;
        Ok(t)
    }
}

/// The error for a tensor in a block format without kernels.
pub fn check_supported(path: &Path, t: &TensorInfo) -> Result<()> {
    if t.ty.is_supported() {
        return Ok(());
    }
    Err(Error::GgufType {
        path: path.to_path_buf(),
        tensor: t.name.clone(),
        ty: t.ty.name(),
        supported: GgmlType::SUPPORTED_NAMES,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let p = Path::new("/m/Qwen3-Q4_K_M-00001-of-00003.gguf");
        assert_eq!(split_name(p), Some(("Qwen3-Q4_K_M".into(), 1, 3)));
        assert_eq!(split_name(Path::new("a-1-of-3.gguf")), None);
        assert_eq!(split_name(Path::new("model.gguf")), None);
    }
}
