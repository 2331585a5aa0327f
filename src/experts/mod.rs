//! `ExpertStore`: the routed experts of a packed model, one file per MoE
//! layer, expert `e` at `[e·expert_size, (e+1)·expert_size)`. Reads go
//! through an I/O thread pool (parallel pread by default); every read is
//! counted.

use crate::error::{Error, Result};
use crate::format::packed::{expert_file_name, LayerLayout, Layout, EXPERTS_DIR};
use crate::format::{AlignedBytes, Region};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How expert bytes come off the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoMode {
    /// One `pread` per expert into an owned buffer (page cache as the host cache).
    #[default]
    Pread,
}

/// Counters of expert traffic.
#[derive(Debug, Default)]
pub struct ExpertStats {
    pub experts_read: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Nanoseconds spent waiting for reads.
    pub read_ns: AtomicU64,
}

/// A snapshot of [`ExpertStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub experts_read: u64,
    pub bytes_read: u64,
    pub read_ns: u64,
}

struct LayerFile {
    path: PathBuf,
    file: File,
    layout: LayerLayout,
}

pub struct ExpertStore {
    layers: Vec<Option<LayerFile>>,
    num_experts: usize,
    group_size: usize,
    mode: IoMode,
    pool: rayon::ThreadPool,
    stats: Arc<ExpertStats>,
}

impl ExpertStore {
    /// Open `DIR/packed_experts/`, checking each layer file's size against
    /// its layout.
    pub fn open(dir: &Path, num_layers: usize, mode: IoMode, io_threads: usize) -> Result<ExpertStore> {
        let layout = Layout::read(dir)?;
        let mut layers = Vec::with_capacity(num_layers);
        for i in 0..num_layers {
            let Some(ll) = layout.layer(i) else {
                layers.push(None);
                continue;
            };
            let path = dir.join(EXPERTS_DIR).join(expert_file_name(i));
            let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
            let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
            let want = (layout.num_experts * ll.expert_size) as u64;
            if len != want {
                return Err(Error::format(
                    &path,
                    format!(
                        "{len} bytes, expected {want} ({} experts × {} bytes): the file is truncated or from another model",
                        layout.num_experts, ll.expert_size
                    ),
                ));
            }
            layers.push(Some(LayerFile {
                path,
                file,
                layout: ll.clone(),
            }));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(io_threads.max(1))
            .thread_name(|i| format!("moeflux-io-{i}"))
            .build()
            .map_err(|e| Error::Invalid(format!("I/O thread pool: {e}")))?;
        Ok(ExpertStore {
            layers,
            num_experts: layout.num_experts,
            group_size: layout.group_size,
            mode,
            pool,
            stats: Arc::new(ExpertStats::default()),
        })
    }

    pub fn num_experts(&self) -> usize {
        self.num_experts
    }
    pub fn group_size(&self) -> usize {
        self.group_size
    }
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    pub fn layer_layout(&self, layer: usize) -> Result<&LayerLayout> {
        self.layer_file(layer).map(|l| &l.layout)
    }

    fn layer_file(&self, layer: usize) -> Result<&LayerFile> {
        self.layers
            .get(layer)
            .and_then(|l| l.as_ref())
            .ok_or_else(|| Error::Invalid(format!("layer {layer} has no expert file")))
    }

    /// Read the experts `ids` of `layer`, in parallel; one blob per id.
    pub fn read(&self, layer: usize, ids: &[u32]) -> Result<Vec<Region>> {
        let lf = self.layer_file(layer)?;
        let size = lf.layout.expert_size;
        for &e in ids {
            if e as usize >= self.num_experts {
                return Err(Error::Invalid(format!("expert {e} of layer {layer} out of range ({})", self.num_experts)));
            }
        }
        let t0 = std::time::Instant::now();
        let blobs: Result<Vec<Region>> = self.pool.install(|| {
            use rayon::prelude::*;
            ids.par_iter()
                .map(|&e| {
                    let mut buf = AlignedBytes::zeroed(size);
                    lf.file
                        .read_exact_at(buf.as_mut_slice(), e as u64 * size as u64)
                        .map_err(|err| Error::io(&lf.path, err))?;
                    Ok(Region::whole(Arc::new(buf)))
                })
                .collect()
        });
        let blobs = blobs?;
        self.stats.experts_read.fetch_add(ids.len() as u64, Ordering::Relaxed);
        self.stats.bytes_read.fetch_add((ids.len() * size) as u64, Ordering::Relaxed);
        self.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(blobs)
    }

    pub fn stats(&self) -> StatsSnapshot {
        StatsSnapshot {
            experts_read: self.stats.experts_read.load(Ordering::Relaxed),
            bytes_read: self.stats.bytes_read.load(Ordering::Relaxed),
            read_ns: self.stats.read_ns.load(Ordering::Relaxed),
        }
    }
}
