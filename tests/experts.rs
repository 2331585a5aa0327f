//! ExpertStore: every read mode returns the bytes a plain read of the file
//! gives; bad files and bad ids are errors; the counters count.

mod common;

use common::convert;
use moeflux::experts::memory::{CgroupLimit, CgroupVersion};
use moeflux::experts::{CacheSize, ExpertStore, IoMode, Memory};
use moeflux::format::packed::{expert_file_name, LayerLayout, Layout, EXPERTS_DIR, LAYOUT_FILE};
use moeflux::format::Region;
use std::collections::BTreeMap;
use std::path::Path;

const NUM_EXPERTS: usize = 15;

/// An expert of 6,912 bytes (not a multiple of 4096, so O_DIRECT reads
/// need covering blocks), 15 of them (the file does not end on a block).
fn layer_layout() -> LayerLayout {
    LayerLayout::quantized(64, 64, 4, 64)
}

/// Write a model dir with expert files for layers 0 and 2 (layer 1 has
/// none) filled with a byte pattern unique to (layer, position).
fn write_store(dir: &Path) {
    let ll = layer_layout();
    assert_eq!(ll.expert_size, 6912);
    let edir = dir.join(EXPERTS_DIR);
    std::fs::create_dir_all(&edir).unwrap();
    let mut layers = BTreeMap::new();
    for layer in [0usize, 2] {
        let bytes: Vec<u8> = (0..NUM_EXPERTS * ll.expert_size)
            .map(|i| ((i * 31 + layer * 7 + i / 251) % 256) as u8)
            .collect();
        std::fs::write(edir.join(expert_file_name(layer)), bytes).unwrap();
        layers.insert(layer.to_string(), ll.clone());
    }
    let layout = Layout {
        num_layers: 3,
        num_experts: NUM_EXPERTS,
        group_size: 64,
        layers,
    };
    std::fs::write(edir.join(LAYOUT_FILE), serde_json::to_string(&layout).unwrap()).unwrap();
}

/// Each of `blobs` holds the bytes of its expert of `ids` in the file of
/// `layer`.
fn same_bytes(dir: &Path, layer: usize, ids: &[u32], blobs: &[Region], what: impl std::fmt::Display) {
    assert_eq!(ids.len(), blobs.len(), "{what}");
    for (&e, b) in ids.iter().zip(blobs) {
        assert_eq!(
            b.bytes(),
            expected(dir, layer, e as usize).as_slice(),
            "{what} expert {e}"
        );
    }
}

fn expected(dir: &Path, layer: usize, e: usize) -> Vec<u8> {
    let all = std::fs::read(dir.join(EXPERTS_DIR).join(expert_file_name(layer))).unwrap();
    let size = layer_layout().expert_size;
    all[e * size..(e + 1) * size].to_vec()
}

#[test]
fn every_mode_returns_the_bytes_of_a_plain_read() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    let ids = [0u32, 14, 3, 7, 7, 1];
    for mode in [IoMode::Pread, IoMode::Mmap, IoMode::Direct] {
        let store = ExpertStore::open(tmp.path(), 3, mode, 3).unwrap();
        // Direct falls back to Pread where the filesystem refuses O_DIRECT.
        let fallback = mode == IoMode::Direct && store.mode() == IoMode::Pread;
        assert!(store.mode() == mode || fallback, "{mode} opened as {}", store.mode());
        for layer in [0usize, 2] {
            let blobs = store.read(layer, &ids).unwrap();
            assert_eq!(blobs.len(), ids.len());
            for (&e, b) in ids.iter().zip(&blobs) {
                assert_eq!(
                    b.bytes(),
                    expected(tmp.path(), layer, e as usize).as_slice(),
                    "{mode} layer {layer} expert {e}"
                );
            }
        }
        // The blobs parse as the layout's matrices.
        let blob = &store.read(2, &[5]).unwrap()[0];
        let [g, _, d] = store
            .layer_layout(2)
            .unwrap()
            .matrices(blob, store.group_size())
            .unwrap();
        assert_eq!((g.rows, g.cols, d.rows, d.cols), (64, 64, 64, 64));
    }
}

#[test]
fn io_mode_parses_from_the_command_line() {
    assert_eq!("pread".parse::<IoMode>().unwrap(), IoMode::Pread);
    assert_eq!("mmap".parse::<IoMode>().unwrap(), IoMode::Mmap);
    assert_eq!("Direct".parse::<IoMode>().unwrap(), IoMode::Direct);
    let err = "uring".parse::<IoMode>().unwrap_err().to_string();
    assert!(err.contains("uring") && err.contains("pread, mmap or direct"), "{err}");
    assert_eq!("auto".parse::<IoMode>().unwrap(), IoMode::Auto);
    assert_eq!(IoMode::default(), IoMode::Auto);
    assert_eq!(IoMode::Mmap.to_string(), "mmap");
}

#[test]
fn auto_maps_what_fits_in_half_the_available_memory() {
    let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
    let mem = Memory::parse(text).expect("meminfo parses");
    assert_eq!(mem.total, 24_000_000 * 1024);
    assert_eq!(mem.available, 20_000_000 * 1024);
    assert_eq!(Memory::parse("MemTotal: 5 kB\n"), None);
    let gb = 1_000_000_000u64;
    assert_eq!(IoMode::Auto.resolve(4 * gb, Some(mem)), IoMode::Mmap);
    assert_eq!(IoMode::Auto.resolve(mem.available / 2 + 1, Some(mem)), IoMode::Pread);
    assert_eq!(IoMode::Auto.resolve(mem.total + 1, Some(mem)), IoMode::Direct);
    assert_eq!(IoMode::Auto.resolve(4 * gb, None), IoMode::Pread);
    for mode in [IoMode::Pread, IoMode::Mmap, IoMode::Direct] {
        assert_eq!(mode.resolve(4 * gb, Some(mem)), mode);
        assert_eq!(mode.resolve(100 * gb, Some(mem)), mode);
    }
}

#[test]
fn auto_counts_the_cgroup_limit() {
    let gb = 1_000_000_000u64;
    // A 128 GB host, the process in a container limited to 16 GB.
    let host = Memory::parse("MemTotal: 125000000 kB\nMemAvailable: 120000000 kB\n").unwrap();
    let limit = CgroupLimit {
        version: CgroupVersion::V2,
        limit: 16 * gb,
        usage: gb,
        reclaimable: 0,
    };
    let mem = host.limited_by(&[limit]);
    assert_eq!((mem.total, mem.available), (16 * gb, 15 * gb));
    // 19.3 GB of experts: mapped on the host, over the limit in the container.
    assert_eq!(IoMode::Auto.resolve(19_300_000_000, Some(host)), IoMode::Mmap);
    assert_eq!(IoMode::Auto.resolve(19_300_000_000, Some(mem)), IoMode::Direct);
    assert_eq!(IoMode::Auto.resolve(10 * gb, Some(mem)), IoMode::Pread);
    assert_eq!(IoMode::Auto.resolve(7 * gb, Some(mem)), IoMode::Mmap);
    assert_eq!(IoMode::Pread.resolve(7 * gb, Some(mem)), IoMode::Pread);
    assert_eq!(mem.to_string(), "15.0 GB available under cgroup memory.max 16.0 GB");
}

#[test]
fn this_machines_memory_reads() {
    let mem = Memory::read().expect("/proc/meminfo reads on Linux");
    assert!(mem.available <= mem.host_available && mem.total <= mem.host_total);
    assert!(mem.available > 0, "{mem:?}");
}

#[test]
fn a_store_opened_with_auto_says_which_mode_it_chose() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    let store = ExpertStore::open(tmp.path(), 3, IoMode::Auto, 1).unwrap();
    // A few hundred KiB of experts fit in any machine's memory.
    assert_eq!(store.mode(), IoMode::Mmap);
}

#[test]
fn a_truncated_layer_file_is_rejected_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    let path = tmp.path().join(EXPERTS_DIR).join(expert_file_name(2));
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len((NUM_EXPERTS * 6912 - 100) as u64).unwrap();
    for mode in [IoMode::Pread, IoMode::Mmap, IoMode::Direct] {
        let err = ExpertStore::open(tmp.path(), 3, mode, 1)
            .err()
            .expect("truncated file accepted")
            .to_string();
        assert!(
            err.contains("layer_02.bin") && err.contains("truncated"),
            "{mode}: {err}"
        );
    }
}

#[test]
fn a_missing_layer_file_names_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    std::fs::remove_file(tmp.path().join(EXPERTS_DIR).join(expert_file_name(0))).unwrap();
    let err = ExpertStore::open(tmp.path(), 3, IoMode::Pread, 1)
        .err()
        .expect("missing file accepted")
        .to_string();
    assert!(err.contains("layer_00.bin"), "{err}");
}

#[test]
fn bad_expert_ids_and_layers_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    for mode in [IoMode::Pread, IoMode::Mmap, IoMode::Direct] {
        let store = ExpertStore::open(tmp.path(), 3, mode, 2).unwrap();
        let err = store.read(0, &[2, NUM_EXPERTS as u32]).unwrap_err().to_string();
        assert!(err.contains("expert 15") && err.contains("out of range"), "{err}");
        assert!(store.read(1, &[0]).is_err(), "layer 1 has no expert file");
        assert!(store.read(3, &[0]).is_err(), "layer 3 does not exist");
        assert_eq!(store.stats().experts_read, 0, "failed reads are not counted");
    }
}

#[test]
fn the_counters_count_and_reset() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    for mode in [IoMode::Pread, IoMode::Mmap, IoMode::Direct] {
        let store = ExpertStore::open(tmp.path(), 3, mode, 2).unwrap();
        assert_eq!(store.stats().experts_read, 0);
        store.read(0, &[1, 2, 3]).unwrap();
        store.read(2, &[4]).unwrap();
        let s = store.stats();
        assert_eq!(s.experts_read, 4, "{mode}");
        assert_eq!(s.bytes_read, 4 * 6912, "{mode}");
        assert!(s.read_ns > 0, "{mode}");
        store.reset_stats();
        assert_eq!(store.stats(), Default::default());
        store.read(2, &[0]).unwrap();
        assert_eq!(store.stats().experts_read, 1);
    }
}

/// The weight formats a CUDA device compiles kernels for are the ones the
/// model's matrices use: a 4-bit conversion of the `qwen3_moe` fixture has
/// 4-bit matrices with bf16 scales (code 4), 8-bit routers (code 5) and a
/// bf16 `o_proj` (code 1: its input, 160, is not a multiple of the group
/// size); `--bits 16` keeps every matrix bf16, routers included.
#[test]
fn format_codes_are_the_formats_of_the_models_matrices() {
    use moeflux::backend::cuda::format_codes;
    use moeflux::format::packed::{Layout, WeightsFile};
    let tmp = tempfile::tempdir().unwrap();
    for (flags, want) in [(&[][..], vec![1, 4, 5]), (&["--bits", "16"][..], vec![1])] {
        let dst = tmp.path().join(format!("m{}", flags.len()));
        convert("qwen3_moe", &dst, flags);
        let wf = WeightsFile::open(&dst).unwrap();
        let layout = Layout::read(&dst).unwrap();
        assert_eq!(format_codes(&wf.manifest, &layout), want, "{flags:?}");
    }
}

/// `read_into` with O_DIRECT: straight into an aligned destination at an
/// aligned offset, through a bounce buffer otherwise; the bytes are those
/// `pread` gives either way.
#[test]
fn direct_reads_into_aligned_and_unaligned_destinations() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    let plain = ExpertStore::open(tmp.path(), 3, IoMode::Pread, 1).unwrap();
    let direct = ExpertStore::open(tmp.path(), 3, IoMode::Direct, 1).unwrap();
    if direct.mode() != IoMode::Direct {
        eprintln!("note: this filesystem refuses O_DIRECT: the reads below are plain");
    }
    let mut space = vec![0u8; 3 * 4096];
    let pad = space.as_ptr().align_offset(4096);
    // (expert, offset, length): expert 0 at 0 is aligned; expert 1 starts
    // at 6,912 bytes, and 100 bytes is no whole block.
    for (e, off, len) in [(0u32, 0usize, 4096usize), (1, 0, 4096), (0, 512, 100), (2, 4096, 2048)] {
        let mut want = vec![0u8; len];
        plain.read_into(0, e, off, &mut want).unwrap();
        let dst = &mut space[pad..pad + len];
        direct.read_into(0, e, off, dst).unwrap();
        assert_eq!(&dst[..], &want[..], "expert {e} bytes {off}+{len}");
    }
}

#[test]
fn the_ram_tier_serves_the_same_bytes_and_reads_each_expert_once() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    let size = layer_layout().expert_size as u64;
    for mode in [IoMode::Pread, IoMode::Direct] {
        let mut store = ExpertStore::open(tmp.path(), 3, mode, 2).unwrap();
        // Room for 6 of the 30 experts.
        assert_eq!(store.set_ram_tier(CacheSize::Bytes(6 * size + 1)).unwrap(), 6 * size);
        assert!(store.has_ram_tier());
        assert_eq!(
            store.ram_tier_bytes(),
            6 * size,
            "the tier's budget, before it holds anything"
        );
        for _ in 0..4 {
            for (layer, ids) in [(0usize, [3u32, 9, 1]), (2, [3, 4, 14])] {
                let got = store.read(layer, &ids).unwrap();
                for (r, &e) in got.iter().zip(&ids) {
                    assert_eq!(
                        r.bytes(),
                        &expected(tmp.path(), layer, e as usize)[..],
                        "{mode} {layer}/{e}"
                    );
                }
            }
        }
        let ram = store.ram_stats().expect("a RAM tier");
        assert_eq!((ram.hits, ram.misses), (18, 6), "{mode}");
        assert_eq!(store.stats().experts_read, 6, "{mode}: only misses read the files");
        let err = store.read(0, &[15]).unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
        // Larger than the experts: all of them; 0 and 0%: none.
        assert_eq!(store.set_ram_tier(CacheSize::Bytes(1 << 40)).unwrap(), 30 * size);
        for off in [CacheSize::Bytes(0), CacheSize::Percent(0.0)] {
            assert_eq!(store.set_ram_tier(off).unwrap(), 0);
            assert!(!store.has_ram_tier() && store.ram_stats().is_none());
            assert_eq!(store.ram_tier_bytes(), 0);
        }
        // Auto keeps none where the page cache holds the experts.
        if store.mode() == IoMode::Pread {
            assert_eq!(store.set_ram_tier(CacheSize::Auto).unwrap(), 0);
        }
    }
}

#[test]
fn reads_ahead_give_the_same_bytes_and_count_what_was_used() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    for (mode, tier) in [(IoMode::Pread, false), (IoMode::Direct, false), (IoMode::Direct, true)] {
        let mut store = ExpertStore::open(tmp.path(), 3, mode, 2).unwrap();
        if tier {
            store.set_ram_tier(CacheSize::Bytes(4 * 6912)).unwrap();
        }
        assert!(!store.reads_ahead());
        // Off: a read ahead does nothing.
        store.read_ahead(2, &[1, 2], 2).unwrap();
        assert_eq!(store.ahead_stats(), None);
        store.set_read_ahead(true);
        assert!(store.reads_ahead());
        let before = store.stats().experts_read;
        // Eight guesses for layer 2, best first: the best quarter (4, 11)
        // is read before the tuner has measured anything.
        store.read_ahead(2, &[4, 11, 5, 6, 7, 8, 10, 12], 8).unwrap();
        let ids = [9u32, 0, 4, 11];
        let blobs = store.read(2, &ids).unwrap();
        same_bytes(tmp.path(), 2, &ids, &blobs, mode);
        let a = store.ahead_stats().unwrap();
        assert_eq!((a.read, a.used), (2, 2), "{mode}");
        // Two reads ahead (both waited for) and the two misses they did
        // not cover.
        assert_eq!(store.stats().experts_read - before, 4, "{mode}");
        // Layer 0's guesses drop layer 2's that were not asked for (5, 6:
        // in flight or done, they are not taken).
        store.read_ahead(2, &[5, 6, 7, 8, 10, 12, 13, 14], 8).unwrap();
        store.read_ahead(0, &[3, 1, 2, 5, 6, 7, 8, 9], 8).unwrap();
        let blobs = store.read(2, &[5]).unwrap();
        assert_eq!(blobs[0].bytes(), expected(tmp.path(), 2, 5).as_slice());
        assert_eq!(store.ahead_stats().unwrap().used, 2, "{mode}: 5 was read again");
        // Guesses past the experts are skipped; a layer without experts is
        // an error.
        let read = store.ahead_stats().unwrap().read;
        store.read_ahead(2, &[99, 98, 1, 2, 3, 5, 6, 7], 8).unwrap();
        assert_eq!(store.ahead_stats().unwrap().read, read, "{mode}");
        assert!(store.read_ahead(1, &[0], 1).is_err(), "layer 1 has no experts");
        if tier {
            // What the tier holds is not read ahead: 9 (just read) is, 13 is not.
            store.read(2, &[9]).unwrap();
            store.read_ahead(2, &[9, 13, 1, 2, 3, 4, 6, 7], 8).unwrap();
            assert_eq!(store.ahead_stats().unwrap().read, read + 1, "{:?}", store.ram_stats());
        }
    }
}

#[test]
fn a_batched_steps_reads_ahead_take_every_tokens_best_guesses() {
    let tmp = tempfile::tempdir().unwrap();
    write_store(tmp.path());
    for mode in [IoMode::Pread, IoMode::Direct] {
        let mut store = ExpertStore::open(tmp.path(), 3, mode, 2).unwrap();
        store.set_read_ahead(true);
        // Three tokens' eight guesses each, best first: before the tuner
        // has measured anything each token's best quarter (2) is read,
        // rank by rank and each expert once: 4, 11, 6, then 5.
        let guesses = [
            4, 11, 1, 2, 3, 7, 8, 9, //
            11, 5, 1, 2, 3, 7, 8, 9, //
            6, 4, 1, 2, 3, 7, 8, 9,
        ];
        let before = store.stats().experts_read;
        store.read_ahead(2, &guesses, 8).unwrap();
        assert_eq!(store.ahead_stats().unwrap().read, 4, "{mode}");
        let ids = [4u32, 5, 6, 11];
        let blobs = store.read(2, &ids).unwrap();
        same_bytes(tmp.path(), 2, &ids, &blobs, mode);
        assert_eq!(store.ahead_stats().unwrap().used, 4, "{mode}");
        // The four reads ahead (each waited for by the read), nothing more.
        assert_eq!(
            store.stats().experts_read - before,
            4,
            "{mode}: all four were read ahead"
        );
        // Guesses that are not whole rows of k are refused, by name.
        let err = store.read_ahead(2, &guesses[..7], 8).unwrap_err().to_string();
        assert!(err.contains("read ahead") && err.contains("rows of 8"), "{err}");
    }
}

/// Regression: a model file truncated under a running model ended the
/// process (SIGBUS/SIGSEGV on the mapped pages). Every evaluation after
/// the change is an error naming the file; nothing crashes.
#[test]
fn files_changed_under_a_running_model_are_an_error_naming_them() {
    type Change = fn(&Path);
    let truncate: Change = |p| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(0)
            .unwrap();
    };
    let replace: Change = |p| {
        let bytes = std::fs::read(p).unwrap();
        let tmp = p.with_extension("new");
        std::fs::write(&tmp, &bytes).unwrap();
        std::fs::rename(&tmp, p).unwrap();
    };
    let cases: [(&str, IoMode, Change); 4] = [
        ("packed_experts/layer_00.bin", IoMode::Mmap, truncate),
        ("model_weights.bin", IoMode::Mmap, truncate),
        ("packed_experts/layer_02.bin", IoMode::Pread, truncate),
        ("model_weights.bin", IoMode::Pread, replace),
    ];
    for (file, io_mode, change) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        convert("qwen3_moe", &dir, &[]);
        let opts = moeflux::Options {
            device: moeflux::Device::Cpu,
            io_mode,
            ..moeflux::Options::default()
        };
        let model = moeflux::Model::open(&dir, &opts).unwrap();
        let mut s = model.session().unwrap();
        s.eval_prompt(&[1, 2, 3], 0).unwrap();
        change(&dir.join(file));
        for _ in 0..2 {
            let e = s.eval_token(4, 3).unwrap_err().to_string();
            assert!(e.contains(file) && e.contains("changed"), "{file} ({io_mode}): {e}");
        }
        let mut fresh = model.session().unwrap();
        let e = fresh.eval_prompt(&[1, 2], 0).unwrap_err().to_string();
        assert!(e.contains(file), "{e}");
    }
}
