//! The serde `Serializer`: compact JSON, as `serde_json::Serializer` with its default
//! `CompactFormatter` writes it.

use serde::ser::{self, Serialize};
use serde_json::Error;

use crate::{Sink, push_escaped};

/// serde_json's private names for a `RawValue` and (with `arbitrary_precision`) a `Number`:
/// structs of one field whose string is JSON text to write as it is.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// Writes JSON text into a [`Sink`].
pub struct Serializer<'o, S: ?Sized> {
    out: &'o mut S,
}

impl<'o, S: Sink + ?Sized> Serializer<'o, S> {
    pub fn new(out: &'o mut S) -> Self {
        Self { out }
    }

    #[inline]
    fn integer<I: itoa::Integer>(&mut self, value: I) {
        self.out.push_text(itoa::Buffer::new().format(value));
    }

    /// `{"variant":` of an enum variant with content.
    fn open_variant(&mut self, variant: &str) {
        self.out.push_ascii(b'{');
        push_escaped(self.out, variant);
        self.out.push_ascii(b':');
    }
}

/// A float as serde_json writes one: shortest round-trip digits (zmij's, as serde_json's own),
/// `null` when not finite.
trait Float: zmij::Float + Copy {
    fn is_finite(self) -> bool;
}

impl Float for f32 {
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
}

impl Float for f64 {
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
}

fn push_float<S: Sink + ?Sized, F: Float>(out: &mut S, value: F) {
    if value.is_finite() {
        out.push_text(zmij::Buffer::new().format_finite(value));
    } else {
        out.push_text("null");
    }
}

impl<'a, 'o, S: Sink + ?Sized> ser::Serializer for &'a mut Serializer<'o, S> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Compound<'a, 'o, S>;
    type SerializeTuple = Compound<'a, 'o, S>;
    type SerializeTupleStruct = Compound<'a, 'o, S>;
    type SerializeTupleVariant = Compound<'a, 'o, S>;
    type SerializeMap = Compound<'a, 'o, S>;
    type SerializeStruct = Compound<'a, 'o, S>;
    type SerializeStructVariant = Compound<'a, 'o, S>;

    fn serialize_bool(self, value: bool) -> Result<(), Error> {
        self.out.push_text(if value { "true" } else { "false" });
        Ok(())
    }

    fn serialize_i8(self, value: i8) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_i16(self, value: i16) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_i32(self, value: i32) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_i64(self, value: i64) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_i128(self, value: i128) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_u8(self, value: u8) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_u16(self, value: u16) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_u32(self, value: u32) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_u64(self, value: u64) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_u128(self, value: u128) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_f32(self, value: f32) -> Result<(), Error> {
        push_float(self.out, value);
        Ok(())
    }

    fn serialize_f64(self, value: f64) -> Result<(), Error> {
        push_float(self.out, value);
        Ok(())
    }

    fn serialize_char(self, value: char) -> Result<(), Error> {
        push_escaped(self.out, value.encode_utf8(&mut [0; 4]));
        Ok(())
    }

    fn serialize_str(self, value: &str) -> Result<(), Error> {
        push_escaped(self.out, value);
        Ok(())
    }

    /// An array of numbers, as serde_json writes bytes.
    fn serialize_bytes(self, value: &[u8]) -> Result<(), Error> {
        self.out.push_ascii(b'[');
        for (i, byte) in value.iter().enumerate() {
            if i > 0 {
                self.out.push_ascii(b',');
            }
            self.integer(*byte);
        }
        self.out.push_ascii(b']');
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push_text("null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.open_variant(variant);
        value.serialize(&mut *self)?;
        self.out.push_ascii(b'}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        self.out.push_ascii(b'[');
        Ok(Compound::new(self, Close::Array))
    }

    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        self.open_variant(variant);
        self.out.push_ascii(b'[');
        Ok(Compound::new(self, Close::VariantArray))
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        self.out.push_ascii(b'{');
        Ok(Compound::new(self, Close::Object))
    }

    fn serialize_struct(
        self,
        name: &'static str,
        len: usize,
    ) -> Result<Self::SerializeStruct, Error> {
        if name == RAW_VALUE_TOKEN || name == NUMBER_TOKEN {
            return Ok(Compound::new(self, Close::Raw));
        }
        self.serialize_map(Some(len))
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        self.open_variant(variant);
        self.out.push_ascii(b'{');
        Ok(Compound::new(self, Close::VariantObject))
    }
}

/// What ends a compound value, and so what kind it is.
#[derive(Clone, Copy)]
enum Close {
    Array,
    Object,
    /// `{"variant":[…]}`
    VariantArray,
    /// `{"variant":{…}}`
    VariantObject,
    /// serde_json's raw JSON text (see [`RAW_VALUE_TOKEN`]): its one field is written as is.
    Raw,
}

/// An array or object being written.
pub struct Compound<'a, 'o, S: ?Sized> {
    ser: &'a mut Serializer<'o, S>,
    close: Close,
    first: bool,
}

impl<'a, 'o, S: Sink + ?Sized> Compound<'a, 'o, S> {
    fn new(ser: &'a mut Serializer<'o, S>, close: Close) -> Self {
        Self {
            ser,
            close,
            first: true,
        }
    }

    #[inline]
    fn separate(&mut self) {
        if self.first {
            self.first = false;
        } else {
            self.ser.out.push_ascii(b',');
        }
    }

    fn element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        self.separate();
        value.serialize(&mut *self.ser)
    }

    fn field<T: ?Sized + Serialize>(&mut self, key: &str, value: &T) -> Result<(), Error> {
        if let Close::Raw = self.close {
            return write_raw(self.ser.out, value);
        }
        self.separate();
        push_escaped(self.ser.out, key);
        self.ser.out.push_ascii(b':');
        value.serialize(&mut *self.ser)
    }

    fn finish(self) -> Result<(), Error> {
        self.ser.out.push_text(match self.close {
            Close::Array => "]",
            Close::Object => "}",
            Close::VariantArray => "]}",
            Close::VariantObject => "}}",
            Close::Raw => "",
        });
        Ok(())
    }
}

/// The text of serde_json's raw value (a string holding JSON), written as it is. Rare (stored
/// documents), so it goes through a `Value`.
fn write_raw<S: Sink + ?Sized, T: ?Sized + Serialize>(out: &mut S, value: &T) -> Result<(), Error> {
    match serde_json::to_value(value)? {
        serde_json::Value::String(text) => {
            out.push_text(&text);
            Ok(())
        }
        _ => Err(ser::Error::custom("expected RawValue")),
    }
}

/// The four compounds of elements (arrays, and tuples of every kind): each element after a
/// comma, then the close.
macro_rules! element_compound {
    ($($trait:ident::$method:ident),* $(,)?) => {$(
        impl<S: Sink + ?Sized> ser::$trait for Compound<'_, '_, S> {
            type Ok = ();
            type Error = Error;
            fn $method<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }
            fn end(self) -> Result<(), Error> {
                self.finish()
            }
        }
    )*};
}

element_compound!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

impl<S: Sink + ?Sized> ser::SerializeMap for Compound<'_, '_, S> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, key: &T) -> Result<(), Error> {
        self.separate();
        write_key(self.ser.out, key)?;
        self.ser.out.push_ascii(b':');
        Ok(())
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(&mut *self.ser)
    }
    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

/// The two compounds of named fields (structs, and struct variants).
macro_rules! field_compound {
    ($($trait:ident),* $(,)?) => {$(
        impl<S: Sink + ?Sized> ser::$trait for Compound<'_, '_, S> {
            type Ok = ();
            type Error = Error;
            fn serialize_field<T: ?Sized + Serialize>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.field(key, value)
            }
            fn end(self) -> Result<(), Error> {
                self.finish()
            }
        }
    )*};
}

field_compound!(SerializeStruct, SerializeStructVariant);

/// A map key: a string (or what serializes as one: a char, a unit variant, a newtype around
/// a string) is written here; any other key (a number, a bool, …) as serde_json writes it, or
/// with its error.
fn write_key<S: Sink + ?Sized, T: ?Sized + Serialize>(out: &mut S, key: &T) -> Result<(), Error> {
    match key.serialize(StrKey { out: &mut *out }) {
        Ok(()) => Ok(()),
        Err(NotAStr) => {
            let text = serde_json::to_string(&OneKey(key))?;
            // `{` key `:null}`
            let key_text = text
                .get(1..text.len().saturating_sub(6))
                .ok_or_else(|| <Error as ser::Error>::custom("map key"))?;
            out.push_text(key_text);
            Ok(())
        }
    }
}

/// A map of `key` alone, for serde_json to write a key of another kind than a string.
struct OneKey<'k, K: ?Sized>(&'k K);

impl<K: ?Sized + Serialize> Serialize for OneKey<'_, K> {
    fn serialize<S: ser::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(self.0, &())?;
        map.end()
    }
}

/// The key is not a string: serde_json decides what it becomes.
#[derive(Debug)]
struct NotAStr;

impl std::fmt::Display for NotAStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a string key")
    }
}

impl std::error::Error for NotAStr {}

impl ser::Error for NotAStr {
    fn custom<T: std::fmt::Display>(_msg: T) -> Self {
        NotAStr
    }
}

/// Writes a key that serializes as a string; refuses any other with [`NotAStr`] before
/// writing anything.
struct StrKey<'o, S: ?Sized> {
    out: &'o mut S,
}

macro_rules! not_a_str {
    ($($method:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $method(self, $(_: $arg),*) -> Result<(), NotAStr> { Err(NotAStr) })*
    };
}

impl<S: Sink + ?Sized> ser::Serializer for StrKey<'_, S> {
    type Ok = ();
    type Error = NotAStr;
    type SerializeSeq = ser::Impossible<(), NotAStr>;
    type SerializeTuple = ser::Impossible<(), NotAStr>;
    type SerializeTupleStruct = ser::Impossible<(), NotAStr>;
    type SerializeTupleVariant = ser::Impossible<(), NotAStr>;
    type SerializeMap = ser::Impossible<(), NotAStr>;
    type SerializeStruct = ser::Impossible<(), NotAStr>;
    type SerializeStructVariant = ser::Impossible<(), NotAStr>;

    not_a_str!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
    );

    fn serialize_char(self, value: char) -> Result<(), NotAStr> {
        push_escaped(self.out, value.encode_utf8(&mut [0; 4]));
        Ok(())
    }

    fn serialize_str(self, value: &str) -> Result<(), NotAStr> {
        push_escaped(self.out, value);
        Ok(())
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _value: &T) -> Result<(), NotAStr> {
        Err(NotAStr)
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), NotAStr> {
        self.serialize_str(variant)
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), NotAStr> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<(), NotAStr> {
        Err(NotAStr)
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, NotAStr> {
        Err(NotAStr)
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, NotAStr> {
        Err(NotAStr)
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, NotAStr> {
        Err(NotAStr)
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, NotAStr> {
        Err(NotAStr)
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, NotAStr> {
        Err(NotAStr)
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, NotAStr> {
        Err(NotAStr)
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, NotAStr> {
        Err(NotAStr)
    }
}
