//! An SPI call or a column read that failed, as an error: never a Rust panic (which PostgreSQL
//! would report as XX000 with Rust's text), and with the SQLSTATE its kind says.

use std::fmt;

use super::SdError;

/// What an SPI call or a column read can fail with: a value of another type than the one read
/// (42804), or anything else (55000), told by the error's kind, never by its text.
pub trait Cause: fmt::Display {
    fn is_datatype(&self) -> bool;
}

impl Cause for pgrx::spi::SpiError {
    fn is_datatype(&self) -> bool {
        matches!(self, pgrx::spi::SpiError::DatumError(_))
    }
}

impl Cause for pgrx::datum::TryFromDatumError {
    fn is_datatype(&self) -> bool {
        true
    }
}

/// Not about a value's type: a problem the extension describes itself (a column missing), a
/// time out of range, a trigger called as something else, a number that does not parse.
macro_rules! other_causes {
    ($($t:ty),*) => {
        $(impl Cause for $t {
            fn is_datatype(&self) -> bool {
                false
            }
        })*
    };
}
other_causes!(
    String,
    pgrx::datetime::FromTimeError,
    pgrx::PgTriggerError,
    std::num::ParseIntError
);

/// The value of an SPI call or column read, or an error naming the step: never a Rust panic,
/// which PostgreSQL would report as XX000 with Rust's text.
pub fn spi<T, E: Cause>(during: &'static str, result: Result<T, E>) -> T {
    result.unwrap_or_else(|e| {
        SdError::Spi {
            during,
            datatype: e.is_datatype(),
            cause: e.to_string(),
        }
        .raise()
    })
}

/// The argument, or a 22004 naming it: SQL functions take `Option`s so that a NULL gets a clear
/// error instead of a silent NULL result (what STRICT would give).
pub fn required<T>(value: Option<T>, what: &'static str) -> T {
    value.unwrap_or_else(|| SdError::NullValue { what }.raise())
}
