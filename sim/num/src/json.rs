//! JSON forms of floats that may be non-finite.
//!
//! JSON numbers cannot be NaN or infinite, and `serde_json` writes all three as `null`, so a
//! reader cannot tell a NaN loss from an overflowed one. Fields given
//! `#[serde(with = "faultline_num::json")]` write a finite value as a plain JSON number (the
//! same bytes as without the attribute) and a non-finite one as the JSON string `"NaN"`,
//! `"Infinity"` or `"-Infinity"`, the spellings Python's `float()` reads back.
//!
//! Reading accepts those three strings, plain numbers and `null` (what files written before
//! this encoding hold). `null` reads as NaN in a float, and as `None` in an `Option` (so a
//! `null` read into an `Option<f64>` is "absent", not NaN). A NaN's sign and payload are not
//! kept: every NaN reads back as [`f64::NAN`]; infinities and finite values read back bit for
//! bit (finite ones given `serde_json`'s `float_roundtrip`).
//!
//! One attribute serves every float shape [`JsonFloat`] covers: `f64`, `f32`, and `Option`s
//! and `Vec`s of them. An optional field also needs `#[serde(default)]` to stay optional (serde
//! only defaults a missing `Option` field without a `with`). [`Spelled`] wraps a value for use
//! outside a derived struct, e.g. `serde_json::from_str::<Spelled<Vec<f64>>>(text)`.

use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::ser::{Serialize, Serializer};
use std::fmt;

/// The string a non-finite value is written as (`None` for a finite one).
fn non_finite_name(v: f64) -> Option<&'static str> {
    match v {
        _ if v.is_nan() => Some("NaN"),
        f64::INFINITY => Some("Infinity"),
        f64::NEG_INFINITY => Some("-Infinity"),
        _ => None,
    }
}

/// A value whose floats are written and read in the encoding of this module.
pub trait JsonFloat: Sized {
    /// Writes `self`, non-finite floats as strings.
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error>;
    /// Reads a value written by [`JsonFloat::write`] or a plain one (numbers, `null`).
    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

/// `serialize_with` half of `#[serde(with = "faultline_num::json")]`.
pub fn serialize<T: JsonFloat, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    v.write(s)
}

/// `deserialize_with` half of `#[serde(with = "faultline_num::json")]`.
pub fn deserialize<'de, T: JsonFloat, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    T::read(d)
}

/// A value serialised and deserialised in this module's encoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spelled<T>(pub T);

impl<T: JsonFloat> Serialize for Spelled<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.write(s)
    }
}

impl<'de, T: JsonFloat> Deserialize<'de> for Spelled<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::read(d).map(Spelled)
    }
}

/// Reads any of the accepted forms as an `f64`.
struct FloatVisitor;

impl Visitor<'_> for FloatVisitor {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number, \"NaN\", \"Infinity\", \"-Infinity\" or null")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }

    // Integers as serde's own `f64` visitor converts them (`1` is a valid float in JSON).
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        match v {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
        }
    }

    // `null`: what `serde_json` wrote for every non-finite value before this encoding.
    fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }

    fn visit_none<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }
}

impl JsonFloat for f64 {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match non_finite_name(*self) {
            Some(name) => s.serialize_str(name),
            None => s.serialize_f64(*self),
        }
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `any`: the form (number, string, null) is only known once it is seen.
        d.deserialize_any(FloatVisitor)
    }
}

impl JsonFloat for f32 {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match non_finite_name(f64::from(*self)) {
            Some(name) => s.serialize_str(name),
            // As f32: its shortest form differs from the f64 it widens to (0.1 vs 0.10000000149011612).
            None => s.serialize_f32(*self),
        }
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Narrowed as serde's own `f32` does (it, too, parses the number as an f64 first).
        d.deserialize_any(FloatVisitor).map(|v| v as f32)
    }
}

impl<T: JsonFloat> JsonFloat for Option<T> {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Some(v) => s.serialize_some(&SpelledRef(v)),
            None => s.serialize_none(),
        }
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Option::<Spelled<T>>::deserialize(d)?.map(|v| v.0))
    }
}

impl<T: JsonFloat> JsonFloat for Vec<T> {
    fn write<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter().map(SpelledRef))
    }

    fn read<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Vec::<Spelled<T>>::deserialize(d)?.into_iter().map(|v| v.0).collect())
    }
}

/// A borrowed value, serialised in this module's encoding (for the elements of `Option`s and
/// `Vec`s, which are written without being moved out).
struct SpelledRef<'a, T>(&'a T);

impl<T: JsonFloat> Serialize for SpelledRef<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.write(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize)]
    struct Fields {
        #[serde(with = "crate::json")]
        x: f64,
        #[serde(with = "crate::json")]
        y: f32,
        #[serde(with = "crate::json", default)]
        o: Option<f64>,
        #[serde(with = "crate::json")]
        v: Vec<f64>,
        #[serde(with = "crate::json")]
        w: Vec<f32>,
        #[serde(with = "crate::json")]
        vo: Vec<Option<f64>>,
    }

    /// The same value with serde's own float handling.
    #[derive(Serialize)]
    struct Plain {
        x: f64,
        y: f32,
        o: Option<f64>,
        v: Vec<f64>,
        w: Vec<f32>,
        vo: Vec<Option<f64>>,
    }

    fn same(a: f64, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
    }

    #[test]
    fn non_finite_values_are_named_and_read_back() {
        let f = Fields {
            x: f64::NEG_INFINITY,
            y: f32::NAN,
            o: Some(f64::INFINITY),
            v: vec![1.5, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0],
            w: vec![0.1, f32::NEG_INFINITY, f32::INFINITY],
            vo: vec![None, Some(f64::NAN), Some(2.0)],
        };
        let text = serde_json::to_string(&f).unwrap();
        assert_eq!(
            text,
            r#"{"x":"-Infinity","y":"NaN","o":"Infinity","v":[1.5,"NaN","Infinity","-Infinity",-0.0],"w":[0.1,"-Infinity","Infinity"],"vo":[null,"NaN",2.0]}"#
        );
        let back: Fields = serde_json::from_str(&text).unwrap();
        assert!(same(back.x, f.x) && back.y.is_nan() && back.o == Some(f64::INFINITY));
        assert!(back.v.iter().zip(&f.v).all(|(a, b)| same(*a, *b)) && back.v.len() == 5);
        assert_eq!(back.w[0].to_bits(), 0.1f32.to_bits());
        assert_eq!(&back.w[1..], &[f32::NEG_INFINITY, f32::INFINITY]);
        assert!(back.vo[0].is_none() && back.vo[1].is_some_and(f64::is_nan) && back.vo[2] == Some(2.0));
        // Through a `Value` (what untagged enums and `from_value` readers see) too.
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let back: Fields = serde_json::from_value(v).unwrap();
        assert!(same(back.x, f64::NEG_INFINITY) && back.y.is_nan());
    }

    #[test]
    fn finite_values_are_written_as_serde_writes_them() {
        let (x, y) = (0.1 + 0.2, 1.0f32 / 3.0);
        let plain = Plain {
            x,
            y,
            o: Some(1e300),
            v: vec![5e-324, -2.5, 1.0],
            w: vec![y, f32::MAX, f32::MIN_POSITIVE],
            vo: vec![None, Some(3.0)],
        };
        let f = Fields { x, y, o: plain.o, v: plain.v.clone(), w: plain.w.clone(), vo: plain.vo.clone() };
        let text = serde_json::to_string(&f).unwrap();
        assert_eq!(text, serde_json::to_string(&plain).unwrap());
        let back: Fields = serde_json::from_str(&text).unwrap();
        assert_eq!((back.x.to_bits(), back.y.to_bits()), (x.to_bits(), y.to_bits()));
        assert_eq!((back.v, back.w, back.o, back.vo), (f.v, f.w, f.o, f.vo));
    }

    #[test]
    fn older_files_and_plain_numbers_read() {
        // `null` was every non-finite value: NaN in a float, absent in an `Option`.
        let old = r#"{"x":null,"y":3,"o":null,"v":[null,-7,1e308],"w":[null],"vo":[null,1]}"#;
        let f: Fields = serde_json::from_str(old).unwrap();
        assert!(f.x.is_nan() && f.y == 3.0 && f.o.is_none());
        assert!(f.v[0].is_nan() && f.v[1] == -7.0 && f.v[2] == 1e308);
        assert!(f.w[0].is_nan() && f.vo == [None, Some(1.0)]);
        let missing: Fields = serde_json::from_str(r#"{"x":1,"y":2,"v":[],"w":[],"vo":[]}"#).unwrap();
        assert_eq!(missing.o, None);
        let spelled: Spelled<Vec<f64>> = serde_json::from_str(r#"[1,"Infinity"]"#).unwrap();
        assert_eq!(spelled.0, [1.0, f64::INFINITY]);
        assert_eq!(serde_json::to_string(&Spelled(vec![f64::NAN])).unwrap(), r#"["NaN"]"#);
    }

    #[test]
    fn other_strings_are_refused() {
        for bad in [r#""nan""#, r#""inf""#, r#""+Infinity""#, r#""1.5""#, "true", "[1]"] {
            let e = serde_json::from_str::<Spelled<f64>>(bad).unwrap_err().to_string();
            assert!(e.contains(r#"a number, "NaN", "Infinity", "-Infinity" or null"#), "{bad}: {e}");
        }
    }
}
