//! Writing `model_weights.bin`: tensors one after another, each at a
//! 64-byte aligned offset, large matrices encoded in parallel row chunks
//! written in place with `pwrite` (memory stays bounded by the chunks in
//! flight).

use super::matrix::{encode_floats, OutForm};
use super::plan::{MatrixItem, VectorItem};
use super::source::Source;
use super::Progress;
use crate::error::{Error, Result};
use crate::format::packed::{TensorEntry, ALIGN};
use crate::format::Dtype;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Output bytes one parallel chunk of rows aims for.
const CHUNK_BYTES: usize = 4 << 20;

pub struct DenseWriter {
    path: PathBuf,
    file: File,
    end: u64,
    pub tensors: BTreeMap<String, TensorEntry>,
}

impl DenseWriter {
    pub fn create(path: &Path) -> Result<DenseWriter> {
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(DenseWriter {
            path: path.to_path_buf(),
            file,
            end: 0,
            tensors: BTreeMap::new(),
        })
    }

    /// Reserve an aligned range for a tensor and record its entry.
    fn alloc(&mut self, name: String, shape: Vec<usize>, dtype: Dtype, quant: Option<(u32, usize)>) -> Result<u64> {
        let offset = self.end.next_multiple_of(ALIGN);
        let size = (shape.iter().product::<usize>() * dtype.size()) as u64;
        self.end = offset + size;
        let entry = TensorEntry {
            offset,
            size,
            shape,
            dtype: dtype.name().to_string(),
            bits: quant.map(|q| q.0),
            group_size: quant.map(|q| q.1),
        };
        if self.tensors.insert(name.clone(), entry).is_some() {
            return Err(Error::Convert(format!("tensor `{name}` planned twice")));
        }
        Ok(offset)
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> Result<()> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Write matrix `X` as `X.weight` (+ `X.scales`, `X.biases`).
    pub fn matrix(&mut self, m: &MatrixItem, source: &Source, progress: &Progress) -> Result<()> {
        let src = &m.src;
        let form: OutForm = src.out_form(m.target)?;
        let rows = src.rows;
        let woff = self.alloc(
            format!("{}.weight", m.name),
            form.weight_shape(rows),
            form.weight_dtype,
            form.quant,
        )?;
        let (soff, boff) = if form.quant.is_some() {
            let s = self.alloc(
                format!("{}.scales", m.name),
                form.scale_shape(rows),
                form.scale_dtype,
                None,
            )?;
            let b = self.alloc(
                format!("{}.biases", m.name),
                form.scale_shape(rows),
                form.scale_dtype,
                None,
            )?;
            (s, b)
        } else {
            (0, 0)
        };
        let row_out = form.weight_row + 2 * form.scale_row;
        let chunk = (CHUNK_BYTES / row_out.max(1)).clamp(1, rows.max(1));
        let starts: Vec<usize> = (0..rows).step_by(chunk).collect();
        starts.into_par_iter().try_for_each(|r0| {
            progress.check()?;
            let n = chunk.min(rows - r0);
            let mut w = vec![0u8; n * form.weight_row];
            let mut s = vec![0u8; n * form.scale_row];
            let mut b = vec![0u8; n * form.scale_row];
            src.encode_rows(m.target, &form, r0..r0 + n, &mut w, &mut s, &mut b);
            self.write_at(&w, woff + (r0 * form.weight_row) as u64)?;
            if form.quant.is_some() {
                self.write_at(&s, soff + (r0 * form.scale_row) as u64)?;
                self.write_at(&b, boff + (r0 * form.scale_row) as u64)?;
            }
            progress.inc((n * src.src_row_bytes()) as u64);
            src.source_rows(r0..r0 + n).into_iter().for_each(|d| source.release(d));
            Ok(())
        })
    }

    /// Write a small tensor as F32 (`1 + w` for zero-centred norms).
    pub fn vector(&mut self, v: &VectorItem, progress: &Progress) -> Result<()> {
        let n: usize = v.shape.iter().product();
        let mut vals = vec![0f32; n];
        super::plan::float_dtype(&v.src)?.decode_into(v.src.data, &mut vals);
        if v.add_one {
            vals.iter_mut().for_each(|x| *x += 1.0);
        }
        let mut bytes = vec![0u8; n * 4];
        encode_floats(Dtype::F32, &vals, &mut bytes);
        let off = self.alloc(v.name.clone(), v.shape.clone(), Dtype::F32, None)?;
        self.write_at(&bytes, off)?;
        progress.inc(v.src.data.len() as u64);
        Ok(())
    }

    /// Size the file to its last tensor and flush it to disk; returns
    /// the bytes written.
    pub fn finish(&self) -> Result<u64> {
        self.file.set_len(self.end).map_err(|e| Error::io(&self.path, e))?;
        self.file.sync_all().map_err(|e| Error::io(&self.path, e))?;
        Ok(self.end)
    }
}
