//! Kernel microbenchmark on CUDA (run on the device machine by
//! tools/device/run.sh, stage `kernels`): the 4-bit matrix-vector product
//! on large matrices in GB/s, against a device-to-device copy measured in
//! the same run, and the cost of one small launch. Each product is checked
//! against the CPU backend. On a machine without a GPU it is counted as
//! ignored.

#[path = "common/trials.rs"]
mod trials;

use moeflux::backend::cpu::CpuBackend;
use moeflux::backend::cuda::CudaBackend;
use moeflux::backend::Backend;
use moeflux::format::{Dtype, MatrixData, MatrixView, Region};
use std::sync::Arc;
use std::time::Instant;

struct Rng(u64);

impl Rng {
    fn u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.u64() >> 32) as u8).collect()
    }
    /// bf16 values in ±scale, as little-endian bytes.
    fn bf16s(&mut self, n: usize, scale: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                let v = ((self.u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale;
                ((v.to_bits() >> 16) as u16).to_le_bytes()
            })
            .collect()
    }
}

/// A random 4-bit, group-64 matrix with bf16 scales and biases.
fn q4(rng: &mut Rng, rows: usize, cols: usize) -> MatrixView {
    let groups = rows * cols / 64;
    let region = |b: Vec<u8>| Region::whole(Arc::new(b));
    MatrixView {
        rows,
        cols,
        data: MatrixData::Quant {
            bits: 4,
            group_size: 64,
            weight: region(rng.bytes(rows * cols / 2)),
            scales: region(rng.bf16s(groups, 0.02)),
            biases: region(rng.bf16s(groups, 0.1)),
            scale_dtype: Dtype::Bf16,
        },
    }
}

fn main() {
    trials::run(vec![trials::cuda("matvec_bandwidth", matvec_bandwidth)])
}

fn matvec_bandwidth() {
    let gpu = CudaBackend::new(0).expect("open CUDA device 0");
    let cpu = CpuBackend::new();
    let copy = gpu.device_copy_bandwidth().expect("copy bandwidth");
    let lc = gpu.launch_cost().expect("launch cost");
    println!("device-to-device copy: {copy:.0} GB/s (read + write)");
    println!(
        "one small launch: enqueue {:.2} us, on the stream {:.2} us, in one graph {:.2} us, in the backend's graph segments {:.2} us",
        lc.enqueue_us, lc.stream_us, lc.graph_us, lc.segments_us
    );
    println!("| matrix | copies | MB each | us | GB/s | % of copy |");
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    // The last shape is the lm_head of qwen3.6-35b-a3b: one matrix far larger
    // than the 50 MB L2, where launch ramp and tail weigh least.
    for (rows, cols, copies) in [
        (8192, 2048, 8),
        (16384, 4096, 4),
        (2048, 4096, 16),
        (512, 2048, 64),
        (248320, 2048, 1),
    ] {
        let views: Vec<MatrixView> = (0..copies).map(|_| q4(&mut rng, rows, cols)).collect();
        let mats: Vec<_> = views.iter().map(|v| gpu.matrix(v).expect("upload")).collect();
        let xh: Vec<f32> = (0..cols)
            .map(|_| (rng.u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .collect();
        let x = gpu.upload(&xh).expect("upload x");
        let mut y = gpu.alloc(rows).expect("alloc y");
        let reps = 200 / copies * copies;
        let mut best = f64::MAX;
        for _ in 0..5 {
            gpu.synchronize().expect("sync");
            let t = Instant::now();
            for i in 0..reps {
                gpu.linear(&mats[i % copies], &x, 1, &mut y).expect("matvec");
            }
            gpu.synchronize().expect("sync");
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        let bytes = views[0].nbytes() + 4 * (rows + cols);
        let gbs = bytes as f64 / best / 1e9;
        println!(
            "| {rows}×{cols} q4 g64 | {copies} | {:.2} | {:.2} | {gbs:.0} | {:.0}% |",
            bytes as f64 / 1e6,
            best * 1e6,
            100.0 * gbs / copy
        );
        // The last product against the CPU backend's.
        let last = (reps - 1) % copies;
        let mut got = vec![0.0f32; rows];
        gpu.linear(&mats[last], &x, 1, &mut y).expect("matvec");
        gpu.download(&y, 0, &mut got).expect("download");
        let cm = cpu.matrix(&views[last]).expect("cpu matrix");
        let cx = cpu.upload(&xh).expect("cpu x");
        let mut cy = cpu.alloc(rows).expect("cpu y");
        cpu.linear(&cm, &cx, 1, &mut cy).expect("cpu matvec");
        let mut want = vec![0.0f32; rows];
        cpu.download(&cy, 0, &mut want).expect("cpu download");
        let (mut num, mut den) = (0.0f64, 0.0f64);
        for (g, w) in got.iter().zip(&want) {
            num += ((g - w) as f64).powi(2);
            den += (*w as f64).powi(2);
        }
        let rel = (num / den).sqrt();
        assert!(rel < 1e-5, "{rows}×{cols}: relative L2 {rel:e} against the CPU");
    }
}
