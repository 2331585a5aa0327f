//! The AMX kernel on an emulation of the tile instructions (so that its
//! layouts are checked on any AVX-512 VNNI machine), against the VNNI
//! kernel; on a machine with AMX, the op tests run the tiles themselves.

use super::*;
use crate::backend::cpu::fast_tests::check_against_vnni_tiles;
use crate::backend::cpu::qmatvec::Acts;

/// The tiles as the instruction set reference defines them.
struct Emu {
    a: [[[u8; 64]; 16]; 2],
    bh: [[u8; 64]; 16],
    bl: [[u8; 64]; 16],
    ch: [[[i32; 16]; 16]; 2],
    cl: [[[i32; 16]; 16]; 2],
    configured: bool,
}

impl Emu {
    fn new() -> Emu {
        Emu {
            a: [[[0; 64]; 16]; 2],
            bh: [[0; 64]; 16],
            bl: [[0; 64]; 16],
            ch: [[[0; 16]; 16]; 2],
            cl: [[[0; 16]; 16]; 2],
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
        self.ch = [[[0; 16]; 16]; 2];
        self.cl = [[[0; 16]; 16]; 2];
    }
    unsafe fn load_a(&mut self, p0: *const u8, p1: *const u8) {
        load(&mut self.a[0], p0, 64);
        load(&mut self.a[1], p1, 64);
    }
    unsafe fn load_b(&mut self, hi: *const u8, lo: *const u8) {
        load(&mut self.bh, hi, 64);
        load(&mut self.bl, lo, 64);
    }
    // tdpbusd / tdpbuud: C[m][n] += Σ_k Σ_j A[m][4k+j] · B[k][4n+j].
    unsafe fn dot(&mut self) {
        for i in 0..2 {
            for m in 0..16 {
                for n in 0..16 {
                    for k in 0..16 {
                        for j in 0..4 {
                            let a = self.a[i][m][4 * k + j] as i32;
                            self.ch[i][m][n] += a * (self.bh[k][4 * n + j] as i8) as i32;
                            self.cl[i][m][n] += a * self.bl[k][4 * n + j] as i32;
                        }
                    }
                }
            }
        }
    }
    unsafe fn store_c(&mut self, hi: *mut i32, lo: *mut i32) {
        for i in 0..2 {
            for r in 0..16 {
                let at = 16 * (16 * i + r);
                std::ptr::copy_nonoverlapping(self.ch[i][r].as_ptr(), hi.add(at), 16);
                std::ptr::copy_nonoverlapping(self.cl[i][r].as_ptr(), lo.add(at), 16);
            }
        }
    }
    unsafe fn release(&mut self) {
        self.configured = false;
    }
}

/// The kernel on emulated tiles, with blocks of token tiles of at most
/// `block_bytes` of B, its output `[n, rows]` turned into `out` `[rows,
/// n]` (rows `r0..`).
fn emulated(block_bytes: usize) -> impl FnMut(&QuantMat, &Acts, usize, &mut [f32]) {
    move |m, a, r0, out| {
        assert!(quant_supported(m));
        // The kernel reads x's levels in natural order (the test's `a` has
        // them in `Order::Blocks`, as the VNNI tiles read them).
        let xq = crate::backend::cpu::vnni::quantize_x(a.x, &a.xsum, m.cols, m.group_size, m.bits, Order::Natural);
        let xa = tile_x(m, &xq, &a.xsum, a.n);
        let (n, rows) = (a.n, out.len() / a.n);
        let ld = r0 + rows;
        let mut y = vec![f32::NAN; n * ld];
        let to = TokenRows { p: y.as_mut_ptr(), ld };
        // SAFETY: the sizes match and `xa` is x laid out for this layout;
        // the tiles are emulated; `y` holds n · ld floats.
        unsafe { quant_rows_on(&mut Emu::new(), m, &xa, r0, rows, to, block_bytes) };
        for r in 0..rows {
            for t in 0..n {
                out[r * n + t] = y[t * ld + r0 + r];
            }
        }
    }
}

/// The kernel (on emulated tiles) gives the VNNI tiles' results: the
/// same integer group sums, f32 additions in another order. Row counts
/// and token counts that are not multiples of 16, groups of one and two
/// blocks, 4 and 8 bits, f16 and bf16 scales; 18 rows (one pair of row
/// tiles, the second short) and 70 (three pairs, the last a short tile
/// and an empty one).
#[test]
fn tile_products_match_the_vnni_kernel() {
    let layouts = [
        (4, 64, 2048, false),
        (4, 64, 512, true),
        (8, 64, 1280, false),
        (4, 128, 640, false),
    ];
    check_against_vnni_tiles(9, &layouts, 21, 3, &[4, 16, 19, 35], emulated(B_BLOCK_BYTES));
    check_against_vnni_tiles(13, &layouts[1..3], 75, 5, &[4, 19], emulated(B_BLOCK_BYTES));
    // Blocks of one and of two token tiles.
    check_against_vnni_tiles(17, &layouts[..2], 40, 2, &[35, 50], emulated(1));
    check_against_vnni_tiles(19, &layouts[2..], 40, 0, &[50], emulated(4 * 20 * TK * TT));
}

/// The tile configuration: palette 1, eight tiles of 16 rows × 64 bytes.
#[test]
fn the_configuration_names_eight_tiles_of_16_rows_of_64_bytes() {
    let c = &CONFIG.0;
    assert_eq!(c[0], 1);
    for t in 0..8 {
        assert_eq!(u16::from_le_bytes([c[16 + 2 * t], c[17 + 2 * t]]), 64);
        assert_eq!(c[48 + t], 16);
    }
    assert!(c[1..16].iter().all(|&v| v == 0) && c[56..].iter().all(|&v| v == 0));
}
