//! The CIP elementary types: the one table of names, type codes, sizes, signedness,
//! float-ness, integer ranges and how BOOL packs. Python reads it through
//! `unskit._core.cip.ELEMENTARY_TYPES` (`python/unskit/elementary_types.py`).

use crate::error::CoreError;

/// The CIP elementary types an assembly field or a polled tag may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CipType {
    Bool,
    Sint,
    Int,
    Dint,
    Lint,
    Usint,
    Uint,
    Udint,
    Ulint,
    Real,
    Lreal,
}

/// The CIP type code of DWORD, the 32-bit bit string a Logix controller stores a BOOL
/// array in (`BOOLS_PER_DWORD` to a word). Not an elementary type a field may have.
pub const DWORD_CODE: u8 = 0xD3;

/// BOOLs packed into one DWORD of a Logix BOOL array tag.
pub const BOOLS_PER_DWORD: usize = 32;

/// BOOLs packed into one byte of an assembly's BOOL array.
pub const BOOLS_PER_BYTE: usize = 8;

impl CipType {
    pub const ALL: [CipType; 11] = [
        CipType::Bool,
        CipType::Sint,
        CipType::Int,
        CipType::Dint,
        CipType::Lint,
        CipType::Usint,
        CipType::Uint,
        CipType::Udint,
        CipType::Ulint,
        CipType::Real,
        CipType::Lreal,
    ];

    /// The type of a configuration name, any case (`DINT`, `dint`).
    pub fn from_name(name: &str) -> Result<Self, CoreError> {
        let upper = name.to_ascii_uppercase();
        CipType::ALL
            .into_iter()
            .find(|t| t.name() == upper)
            .ok_or_else(|| {
                let names: Vec<&str> = CipType::ALL.iter().map(|t| t.name()).collect();
                CoreError::InvalidCip(format!("type {name:?} is not one of {}", names.join(", ")))
            })
    }

    /// The upper-case name, as signal ids carry it.
    pub fn name(self) -> &'static str {
        match self {
            CipType::Bool => "BOOL",
            CipType::Sint => "SINT",
            CipType::Int => "INT",
            CipType::Dint => "DINT",
            CipType::Lint => "LINT",
            CipType::Usint => "USINT",
            CipType::Uint => "UINT",
            CipType::Udint => "UDINT",
            CipType::Ulint => "ULINT",
            CipType::Real => "REAL",
            CipType::Lreal => "LREAL",
        }
    }

    /// The CIP data type code (CIP Vol. 1, C-6.1), as a Logix read reply carries it.
    pub fn code(self) -> u8 {
        match self {
            CipType::Bool => 0xC1,
            CipType::Sint => 0xC2,
            CipType::Int => 0xC3,
            CipType::Dint => 0xC4,
            CipType::Lint => 0xC5,
            CipType::Usint => 0xC6,
            CipType::Uint => 0xC7,
            CipType::Udint => 0xC8,
            CipType::Ulint => 0xC9,
            CipType::Real => 0xCA,
            CipType::Lreal => 0xCB,
        }
    }

    /// Bytes of one element (a lone BOOL takes a whole byte).
    pub fn size(self) -> usize {
        match self {
            CipType::Bool | CipType::Sint | CipType::Usint => 1,
            CipType::Int | CipType::Uint => 2,
            CipType::Dint | CipType::Udint | CipType::Real => 4,
            CipType::Lint | CipType::Ulint | CipType::Lreal => 8,
        }
    }

    /// Two's-complement integers and the floats; BOOL and the U types are unsigned.
    pub fn is_signed(self) -> bool {
        matches!(
            self,
            CipType::Sint | CipType::Int | CipType::Dint | CipType::Lint
        ) || self.is_float()
    }

    pub fn is_float(self) -> bool {
        matches!(self, CipType::Real | CipType::Lreal)
    }

    /// The inclusive range of an integer type.
    pub fn range(self) -> Option<(i128, i128)> {
        Some(match self {
            CipType::Sint => (i8::MIN.into(), i8::MAX.into()),
            CipType::Int => (i16::MIN.into(), i16::MAX.into()),
            CipType::Dint => (i32::MIN.into(), i32::MAX.into()),
            CipType::Lint => (i64::MIN.into(), i64::MAX.into()),
            CipType::Usint => (0, u8::MAX.into()),
            CipType::Uint => (0, u16::MAX.into()),
            CipType::Udint => (0, u32::MAX.into()),
            CipType::Ulint => (0, u64::MAX.into()),
            CipType::Bool | CipType::Real | CipType::Lreal => return None,
        })
    }

    /// Bytes an assembly field of this type covers from its offset: a BOOL bit field one
    /// byte, a BOOL array packed `BOOLS_PER_BYTE` to a byte from bit 0, anything else
    /// `count * size` (a `bit` beside an array count is not a bit field).
    pub fn field_bytes(self, bit: bool, array_count: Option<usize>) -> usize {
        match (self, bit, array_count) {
            (CipType::Bool, true, None) => 1,
            (CipType::Bool, false, Some(n)) => n.div_ceil(BOOLS_PER_BYTE),
            (_, _, count) => count.unwrap_or(1) * self.size(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_run_from_c1_to_cb_in_table_order() {
        let codes: Vec<u8> = CipType::ALL.iter().map(|t| t.code()).collect();
        assert_eq!(codes, (0xC1..=0xCB).collect::<Vec<u8>>());
    }

    #[test]
    fn ranges_match_sizes_and_signedness() {
        for ty in CipType::ALL {
            match ty.range() {
                Some((low, high)) => {
                    let bits = 8 * ty.size() as u32;
                    let (want_low, want_high) = if ty.is_signed() {
                        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
                    } else {
                        (0, (1i128 << bits) - 1)
                    };
                    assert_eq!((low, high), (want_low, want_high), "{}", ty.name());
                }
                None => assert!(ty == CipType::Bool || ty.is_float(), "{}", ty.name()),
            }
        }
    }

    #[test]
    fn names_parse_in_any_case_and_unknown_ones_list_the_table() {
        for ty in CipType::ALL {
            assert_eq!(CipType::from_name(&ty.name().to_lowercase()), Ok(ty));
        }
        let err = CipType::from_name("STRING").unwrap_err().to_string();
        assert!(err.ends_with(
            "type \"STRING\" is not one of BOOL, SINT, INT, DINT, LINT, USINT, UINT, UDINT, \
             ULINT, REAL, LREAL"
        ));
    }

    #[test]
    fn bool_packing() {
        assert_eq!(CipType::Bool.field_bytes(true, None), 1);
        assert_eq!(CipType::Bool.field_bytes(false, None), 1);
        assert_eq!(CipType::Bool.field_bytes(false, Some(1)), 1);
        assert_eq!(CipType::Bool.field_bytes(false, Some(9)), 2);
        assert_eq!(CipType::Bool.field_bytes(true, Some(3)), 3);
        assert_eq!(CipType::Dint.field_bytes(false, Some(3)), 12);
        assert_eq!(CipType::Lreal.field_bytes(false, None), 8);
    }
}
