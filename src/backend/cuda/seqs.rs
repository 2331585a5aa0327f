//! The `Seqs` kernel argument: the rows, positions and state buffers of
//! the sequences of one launch (a batched pass's token mixers, and the
//! prefill attention on tensor cores).

use crate::backend::Seg;

/// Most sequences in one launch (`MAX_SEQS` in kernels/common.cuh).
pub(crate) const MAX_SEQS: usize = 16;

/// The `Seqs` kernel argument (kernels/common.cuh): sequence i holds rows
/// `off[i] .. off[i] + n[i]` at positions `pos0[i] ..`, with state
/// buffers `a[i]` and `b[i]`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Seqs {
    a: [u64; MAX_SEQS],
    b: [u64; MAX_SEQS],
    off: [i32; MAX_SEQS],
    n: [i32; MAX_SEQS],
    pos0: [i32; MAX_SEQS],
    count: i32,
}

// The kernel's struct: 2 × 16 × 8 + 3 × 16 × 4 + 4 bytes, padded to 8.
const _: () = assert!(std::mem::size_of::<Seqs>() == 456);

impl Seqs {
    /// The table of `parts` (state buffers, segment), rows counted from
    /// `base`; at most `MAX_SEQS` parts.
    pub(crate) fn new(parts: &[((u64, u64), Seg)], base: usize) -> Seqs {
        let mut t = Seqs {
            count: parts.len() as i32,
            ..Seqs::default()
        };
        for (i, &((a, b), s)) in parts.iter().enumerate() {
            t.a[i] = a;
            t.b[i] = b;
            t.off[i] = (s.off - base) as i32;
            t.n[i] = s.n as i32;
            t.pos0[i] = s.pos0 as i32;
        }
        t
    }

    /// The most keys a row of the table attends to (its sequence's
    /// positions up to its last row).
    pub(crate) fn longest(&self) -> usize {
        (0..self.count as usize)
            .map(|i| (self.pos0[i] + self.n[i]).max(0) as usize)
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn most_rows(&self) -> usize {
        self.n.iter().copied().max().unwrap_or(0).max(0) as usize
    }

    /// The sequences of at least `rows` rows, and the others (rows still
    /// counted from the same base).
    pub(crate) fn split(&self, rows: usize) -> (Seqs, Seqs) {
        let (mut big, mut small) = (Seqs::default(), Seqs::default());
        for i in 0..self.count as usize {
            let to = if self.n[i] as usize >= rows {
                &mut big
            } else {
                &mut small
            };
            let j = to.count as usize;
            (to.a[j], to.b[j], to.off[j], to.n[j], to.pos0[j]) =
                (self.a[i], self.b[i], self.off[i], self.n[i], self.pos0[i]);
            to.count += 1;
        }
        (big, small)
    }

    /// Whether the table holds no sequence.
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Tiles of `rows` rows, sequence after sequence.
    pub(crate) fn tiles(&self, rows: usize) -> usize {
        self.n[..self.count as usize]
            .iter()
            .map(|&n| (n as usize).div_ceil(rows))
            .sum()
    }
}
