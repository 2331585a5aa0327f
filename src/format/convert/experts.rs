//! Writing `packed_experts/layer_NN.bin`: expert `e` at
//! `[e·expert_size, (e+1)·expert_size)`, its nine components in the order
//! of `layout.json`. Experts are encoded in parallel, one buffer of
//! `expert_size` bytes per worker, and written in place with `pwrite`.

use super::matrix::OutForm;
use super::plan::ExpertLayer;
use super::source::Source;
use super::Progress;
use crate::error::{Error, Result};
use crate::format::packed::{expert_file_name, EXPERTS_DIR};
use rayon::prelude::*;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Write one layer file under `dir`; returns its size in bytes.
pub fn write_layer(dir: &Path, l: &ExpertLayer, source: &Source, progress: &Progress) -> Result<u64> {
    let path = dir.join(EXPERTS_DIR).join(expert_file_name(l.layer));
    let size = l.layout.expert_size;
    let total = (l.experts.len() * size) as u64;
    let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
    file.set_len(total).map_err(|e| Error::io(&path, e))?;
    let forms: Vec<OutForm> = l.experts[0]
        .iter()
        .map(|m| m.out_form(l.target))
        .collect::<Result<_>>()?;
    for (k, form) in forms.iter().enumerate() {
        let c = &l.layout.components[3 * k..3 * k + 3];
        let rows = l.experts[0][k].rows;
        let contiguous = c[1].offset == c[0].offset + c[0].size && c[2].offset == c[1].offset + c[1].size;
        if !contiguous
            || c[0].size != rows * form.weight_row
            || c[1].size != rows * form.scale_row
            || c[2].size != c[1].size
        {
            return Err(Error::Convert(format!(
                "layer {}: `{}` does not match its layout entry (internal error)",
                l.layer, c[0].name
            )));
        }
    }
    l.experts.par_iter().enumerate().try_for_each(|(e, mats)| {
        progress.check()?;
        let mut buf = vec![0u8; size];
        for (k, m) in mats.iter().enumerate() {
            let c = &l.layout.components[3 * k..3 * k + 3];
            let (head, rest) = buf[c[0].offset..].split_at_mut(c[0].size);
            let (s, rest) = rest.split_at_mut(c[1].size);
            let b = &mut rest[..c[2].size];
            m.encode_rows(l.target, &forms[k], 0..m.rows, head, s, b);
            progress.inc((m.rows * m.src_row_bytes()) as u64);
            m.source_rows(0..m.rows).into_iter().for_each(|d| source.release(d));
        }
        file.write_all_at(&buf, (e * size) as u64)
            .map_err(|err| Error::io(&path, err))
    })?;
    file.sync_all().map_err(|e| Error::io(&path, e))?;
    Ok(total)
}
