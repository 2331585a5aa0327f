//! ggml's tensor element types (`enum ggml_type`): their numbers in the
//! file, their names, and the size of one block (elements, bytes).

/// A tensor type as numbered in ggml's `ggml_type`. Types moeflux computes
/// with are listed in [`GgmlType::SUPPORTED`]; the others are known by name
/// so that an error can say what a tensor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
    Nvfp4,
    Q1_0,
    /// A number ggml does not (or no longer) assign.
    Unknown(u32),
}

/// Elements of a K-quant super-block.
pub const QK_K: usize = 256;

use GgmlType::*;

/// `(type, number, name, elements per block, bytes per block)`.
const TABLE: [(GgmlType, u32, &str, usize, usize); 34] = [
    (F32, 0, "F32", 1, 4),
    (F16, 1, "F16", 1, 2),
    (Q4_0, 2, "Q4_0", 32, 18),
    (Q4_1, 3, "Q4_1", 32, 20),
    (Q5_0, 6, "Q5_0", 32, 22),
    (Q5_1, 7, "Q5_1", 32, 24),
    (Q8_0, 8, "Q8_0", 32, 34),
    (Q8_1, 9, "Q8_1", 32, 40),
    (Q2K, 10, "Q2_K", QK_K, 84),
    (Q3K, 11, "Q3_K", QK_K, 110),
    (Q4K, 12, "Q4_K", QK_K, 144),
    (Q5K, 13, "Q5_K", QK_K, 176),
    (Q6K, 14, "Q6_K", QK_K, 210),
    (Q8K, 15, "Q8_K", QK_K, 292),
    (Iq2Xxs, 16, "IQ2_XXS", QK_K, 66),
    (Iq2Xs, 17, "IQ2_XS", QK_K, 74),
    (Iq3Xxs, 18, "IQ3_XXS", QK_K, 98),
    (Iq1S, 19, "IQ1_S", QK_K, 50),
    (Iq4Nl, 20, "IQ4_NL", 32, 18),
    (Iq3S, 21, "IQ3_S", QK_K, 110),
    (Iq2S, 22, "IQ2_S", QK_K, 82),
    (Iq4Xs, 23, "IQ4_XS", QK_K, 136),
    (I8, 24, "I8", 1, 1),
    (I16, 25, "I16", 1, 2),
    (I32, 26, "I32", 1, 4),
    (I64, 27, "I64", 1, 8),
    (F64, 28, "F64", 1, 8),
    (Iq1M, 29, "IQ1_M", QK_K, 56),
    (Bf16, 30, "BF16", 1, 2),
    (Tq1_0, 34, "TQ1_0", QK_K, 54),
    (Tq2_0, 35, "TQ2_0", QK_K, 66),
    (Mxfp4, 39, "MXFP4", 32, 17),
    (Nvfp4, 40, "NVFP4", 64, 36),
    (Q1_0, 41, "Q1_0", 128, 18),
];

impl GgmlType {
    /// The types moeflux dequantizes and computes dot products with.
    pub const SUPPORTED: [GgmlType; 16] = [
        F32, F16, Bf16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2K, Q3K, Q4K, Q5K, Q6K, Iq4Nl, Iq4Xs, Mxfp4,
    ];

    /// The supported types' names, for error messages.
    pub const SUPPORTED_NAMES: &'static str =
        "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4";

    pub fn from_u32(n: u32) -> GgmlType {
        TABLE.iter().find(|t| t.1 == n).map(|t| t.0).unwrap_or(Unknown(n))
    }

    fn entry(self) -> Option<&'static (GgmlType, u32, &'static str, usize, usize)> {
        TABLE.iter().find(|t| t.0 == self)
    }

    pub fn number(self) -> u32 {
        match self {
            Unknown(n) => n,
            t => t.entry().map_or(u32::MAX, |e| e.1),
        }
    }

    /// ggml's name (`Q4_K`, `IQ4_XS`, ...); removed or unknown numbers read
    /// `type N`.
    pub fn name(self) -> String {
        match self.entry() {
            Some(e) => e.2.to_string(),
            None => format!("type {}", self.number()),
        }
    }

    /// `(elements, bytes)` of one block; `None` for unknown numbers.
    pub fn block(self) -> Option<(usize, usize)> {
        self.entry().map(|e| (e.3, e.4))
    }

    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// Bytes of a row of `n` elements; `None` when `n` is not a whole
    /// number of blocks or the type is unknown.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let (be, bb) = self.block()?;
        n.is_multiple_of(be).then(|| n / be * bb)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_and_sizes_are_ggmls() {
        for t in TABLE {
            assert_eq!(GgmlType::from_u32(t.1), t.0);
            assert_eq!(t.0.number(), t.1);
        }
        assert_eq!(GgmlType::from_u32(4), Unknown(4));
        assert_eq!(Unknown(4).name(), "type 4");
        assert_eq!(Q4K.row_bytes(2048), Some(8 * 144));
        assert_eq!(Q4K.row_bytes(2000), None);
        assert_eq!(Mxfp4.row_bytes(64), Some(34));
        assert!(Q6K.is_supported() && !Iq2Xxs.is_supported());
    }
}
