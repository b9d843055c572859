//! Every kind of serde value gives serde_json's text, or its error.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde::{Serialize, Serializer};
use serde_json::{Value, json, value::RawValue};

/// Both writers' results: the same text, or both an error with the same message.
fn assert_same<T: ?Sized + Serialize>(value: &T) {
    let ours = tessera_json::to_string(value).map_err(|e| e.to_string());
    let theirs = serde_json::to_string(value).map_err(|e| e.to_string());
    assert_eq!(ours, theirs);
    let bytes = tessera_json::to_vec(value).map_err(|e| e.to_string());
    assert_eq!(bytes, theirs.map(String::into_bytes));
}

#[derive(Serialize)]
struct Unit;

#[derive(Serialize)]
struct Newtype(String);

#[derive(Serialize)]
struct Pair(i32, &'static str);

#[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Alpha,
    Beta,
}

#[derive(Serialize, PartialEq, Eq, PartialOrd, Ord)]
struct KeyNewtype(String);

#[derive(Serialize)]
enum Shape {
    Unit,
    Newtype(u8),
    Tuple(i8, String),
    Struct { x: f64, label: &'static str },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Tagged {
    Text { content: String },
    Empty,
}

#[derive(Serialize)]
#[serde(tag = "t", content = "c")]
enum Adjacent {
    One(u32),
}

#[derive(Serialize)]
struct Inner {
    a: u8,
}

#[derive(Serialize)]
struct Everything {
    unit: (),
    unit_struct: Unit,
    newtype: Newtype,
    pair: Pair,
    tuple: (u8, char, bool),
    shapes: Vec<Shape>,
    tagged: Vec<Tagged>,
    adjacent: Adjacent,
    none: Option<u8>,
    some: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped: Option<u8>,
    chars: Vec<char>,
    big: (i128, u128, i64, u64),
    floats: (f32, f64, f32, f64, f64, f64),
    enum_keys: BTreeMap<Key, u8>,
    newtype_keys: BTreeMap<KeyNewtype, u8>,
    char_keys: BTreeMap<char, u8>,
    int_keys: BTreeMap<i64, u8>,
    bool_keys: BTreeMap<bool, u8>,
    #[serde(flatten)]
    flattened: Inner,
    raw: Box<RawValue>,
    empty_seq: Vec<u8>,
    empty_map: BTreeMap<String, u8>,
}

struct Bytes(&'static [u8]);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

#[test]
fn every_shape_serde_has_writes_as_serde_json() -> Result<(), serde_json::Error> {
    let everything = Everything {
        unit: (),
        unit_struct: Unit,
        newtype: Newtype("n\"t".into()),
        pair: Pair(-7, "p"),
        tuple: (1, '\n', true),
        shapes: vec![
            Shape::Unit,
            Shape::Newtype(3),
            Shape::Tuple(-1, "t\\".into()),
            Shape::Struct { x: 0.1, label: "l" },
        ],
        tagged: vec![
            Tagged::Text {
                content: "c\u{1}".into(),
            },
            Tagged::Empty,
        ],
        adjacent: Adjacent::One(9),
        none: None,
        some: Some("s"),
        skipped: None,
        chars: vec!['a', '"', '\u{7}', 'é', '💡'],
        big: (i128::MIN, u128::MAX, i64::MIN, u64::MAX),
        floats: (1.5, -0.0, f32::NAN, f64::INFINITY, 1e300, 123_456.789),
        enum_keys: BTreeMap::from([(Key::Alpha, 1), (Key::Beta, 2)]),
        newtype_keys: BTreeMap::from([(KeyNewtype("k\t".into()), 1)]),
        char_keys: BTreeMap::from([('x', 1), ('"', 2)]),
        int_keys: BTreeMap::from([(-3, 1), (4, 2)]),
        bool_keys: BTreeMap::from([(false, 1), (true, 2)]),
        flattened: Inner { a: 5 },
        raw: RawValue::from_string(r#"{"kept" : [1, 2]}"#.to_owned())?,
        empty_seq: Vec::new(),
        empty_map: BTreeMap::new(),
    };
    assert_same(&everything);
    assert_same(&Bytes(b"\x00\x7f\xff"));
    assert_same(&Bytes(b""));
    Ok(())
}

#[test]
fn keys_that_are_not_strings_fail_as_in_serde_json() {
    assert_same(&BTreeMap::from([(vec![1u8], 1u8)]));
    assert_same(&BTreeMap::from([(Some(1u8), 1u8)]));
    assert_same(&BTreeMap::from([((), 1u8)]));
    assert_same(&FloatKeys(vec![(f64::NAN, 1u8)]));
    assert_same(&FloatKeys(vec![(2.5, 1u8)]));
}

/// A map with float keys (no `Ord` for a `BTreeMap`).
struct FloatKeys(Vec<(f64, u8)>);

impl Serialize for FloatKeys {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (*k, *v)))
    }
}

#[test]
fn a_raw_value_alone_and_nested_is_written_as_its_text() -> Result<(), serde_json::Error> {
    let raw = RawValue::from_string("[1,\"two\" , {}]".to_owned())?;
    assert_same(&raw);
    assert_same(&json!({"outer": [1, 2]}));
    Ok(())
}

#[test]
fn appending_keeps_what_the_buffer_held() -> Result<(), serde_json::Error> {
    let mut out = b"prefix:".to_vec();
    tessera_json::write(&mut out, &json!({"a": "b"}))?;
    assert_eq!(out, b"prefix:{\"a\":\"b\"}");
    let mut text = String::from("x");
    tessera_json::write(&mut text, &[1, 2])?;
    assert_eq!(text, "x[1,2]");
    Ok(())
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
        "[\"\\\\\n\t\u{1}a-z]{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn any_json_value_is_written_as_serde_json_writes_it(value in any_json()) {
        let ours = tessera_json::to_string(&value).map_err(|e| e.to_string());
        let theirs = serde_json::to_string(&value).map_err(|e| e.to_string());
        prop_assert_eq!(ours, theirs);
    }
}
