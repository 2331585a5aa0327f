//! The AMX kernel on an emulation of the tile instructions (so that its
//! layouts are checked on any AVX-512 VNNI machine), against the VNNI
//! kernel; on a machine with AMX, the op tests run the tiles themselves.

use super::*;
use crate::backend::cpu::qmatvec::Acts;
use crate::backend::cpu::vnni;

/// The tiles as the instruction set reference defines them.
struct Emu {
    a: [[u8; 64]; 16],
    bh: [[u8; 64]; 16],
    bl: [[u8; 64]; 16],
    ch: [[i32; 16]; 16],
    cl: [[i32; 16]; 16],
    configured: bool,
}

impl Emu {
    fn new() -> Emu {
        Emu {
            a: [[0; 64]; 16],
            bh: [[0; 64]; 16],
            bl: [[0; 64]; 16],
            ch: [[0; 16]; 16],
            cl: [[0; 16]; 16],
            configured: false,
        }
    }
}

unsafe fn load(t: &mut [[u8; 64]; 16], p: *const u8, stride: usize) {
    for (r, row) in t.iter_mut().enumerate() {
        std::ptr::copy_nonoverlapping(p.add(r * stride), row.as_mut_ptr(), 64);
    }
}

impl TileOps for Emu {
    unsafe fn config(&mut self) {
        self.configured = true;
    }
    unsafe fn zero_c(&mut self) {
        assert!(self.configured);
        self.ch = [[0; 16]; 16];
        self.cl = [[0; 16]; 16];
    }
    unsafe fn load_a(&mut self, p: *const u8, stride: usize) {
        load(&mut self.a, p, stride);
    }
    unsafe fn load_b(&mut self, hi: *const u8, lo: *const u8) {
        load(&mut self.bh, hi, 64);
        load(&mut self.bl, lo, 64);
    }
    // tdpbusd / tdpbuud: C[m][n] += Σ_k Σ_j A[m][4k+j] · B[k][4n+j].
    unsafe fn dot(&mut self) {
        for m in 0..16 {
            for n in 0..16 {
                for k in 0..16 {
                    for j in 0..4 {
                        let a = self.a[m][4 * k + j] as i32;
                        self.ch[m][n] += a * (self.bh[k][4 * n + j] as i8) as i32;
                        self.cl[m][n] += a * self.bl[k][4 * n + j] as i32;
                    }
                }
            }
        }
    }
    unsafe fn store_c(&mut self, hi: *mut i32, lo: *mut i32) {
        for r in 0..16 {
            std::ptr::copy_nonoverlapping(self.ch[r].as_ptr(), hi.add(16 * r), 16);
            std::ptr::copy_nonoverlapping(self.cl[r].as_ptr(), lo.add(16 * r), 16);
        }
    }
    unsafe fn release(&mut self) {
        self.configured = false;
    }
}

struct Lcg(u32);
impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 8) as f32 / (1 << 24) as f32 - 0.5
    }
}

/// The kernel (on emulated tiles) gives the VNNI tiles' results: the
/// same integer group sums, f32 additions in another order. Row counts
/// and token counts that are not multiples of 16, groups of one and two
/// blocks, 4 and 8 bits, f16 and bf16 scales.
#[test]
fn tile_products_match_the_vnni_kernel() {
    if !vnni::available() {
        eprintln!("no AVX-512 VNNI here: nothing to compare");
        return;
    }
    let mut rng = Lcg(9);
    for (bits, gs, cols, f16) in [
        (4, 64, 2048, false),
        (4, 64, 512, true),
        (8, 64, 1280, false),
        (4, 128, 640, false),
    ] {
        let rows = 21;
        let w: Vec<u8> = (0..rows * cols * bits / 8).map(|_| rng.next() as u8).collect();
        let mut half = || -> Vec<u8> {
            (0..rows * cols / gs)
                .flat_map(|_| {
                    let v = 0.02 * rng.f32();
                    match f16 {
                        true => half::f16::from_f32(v).to_le_bytes(),
                        false => half::bf16::from_f32(v).to_le_bytes(),
                    }
                })
                .collect()
        };
        let (s, b) = (half(), half());
        let m = QuantMat {
            bits,
            group_size: gs,
            cols,
            weight: &w,
            scales: &s,
            biases: &b,
            f16_scales: f16,
        };
        assert!(quant_supported(&m));
        for n in [4, 16, 19, 35] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let mut a = Acts::new(&x, n, cols, Some(gs));
            a.xq = vnni::quantize_x(&x, &a.xsum, gs, bits);
            let (r0, rn) = (3, rows - 3);
            let mut want = vec![0.0f32; rn * n];
            // SAFETY: VNNI is available, the layout is supported and the
            // sizes match; `a` has no tiles of either kind.
            unsafe { vnni::quant_rows(&m, &a, r0, &mut want) };
            let xa = tile_x(&m, &a.xq, &a.xsum, n);
            let mut got = vec![f32::NAN; rn * n];
            // SAFETY: as above; the tiles are emulated.
            unsafe { quant_rows_on(&mut Emu::new(), &m, &xa, r0, &mut got) };
            let norm = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() <= 1e-5 * norm,
                    "{bits}-bit g{gs} [{rows}, {cols}] n={n}: element {i}: {g} against {e}"
                );
            }
        }
    }
}

/// The tile configuration: palette 1, five tiles of 16 rows × 64 bytes.
#[test]
fn the_configuration_names_five_tiles_of_16_rows_of_64_bytes() {
    let c = &CONFIG.0;
    assert_eq!(c[0], 1);
    for t in 0..5 {
        assert_eq!(u16::from_le_bytes([c[16 + 2 * t], c[17 + 2 * t]]), 64);
        assert_eq!(c[48 + t], 16);
    }
    assert!(c[16 + 10..48].iter().all(|&v| v == 0) && c[53..].iter().all(|&v| v == 0));
}
