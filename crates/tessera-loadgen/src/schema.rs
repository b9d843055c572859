//! A minimal JSON Schema instance generator: the smallest value that validates against the
//! schemas Tessera produces (tool parameters and structured-output models): required
//! properties, types, `enum`/`const` (Literal), nested objects and arrays, `anyOf`/`oneOf`/
//! `allOf`, and `$ref` into `$defs` (including resources embedded with their own `$id`).

use serde_json::{Map, Number, Value};

/// Deepest nesting followed; recursive models stop here (with `null`).
const MAX_DEPTH: usize = 24;

/// A small value valid against `schema` (best effort for `pattern` and `format`).
pub fn instance(schema: &Value) -> Value {
    Generator { root: schema }.generate(schema, schema, 0)
}

struct Generator<'a> {
    root: &'a Value,
}

impl<'a> Generator<'a> {
    /// `resource` is the nearest enclosing schema with an `$id` (or the root): local `#/...`
    /// references resolve against it.
    fn generate(&self, schema: &'a Value, resource: &'a Value, depth: usize) -> Value {
        if depth > MAX_DEPTH {
            return Value::Null;
        }
        let Value::Object(s) = schema else {
            // `true` accepts anything; `false` accepts nothing, so any answer is as good.
            return Value::Null;
        };
        let resource = if s.contains_key("$id") {
            schema
        } else {
            resource
        };
        if let Some(value) = s.get("const") {
            return value.clone();
        }
        if let Some(first) = s
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.first())
        {
            return first.clone();
        }
        if let Some(reference) = s.get("$ref").and_then(Value::as_str) {
            return match self.resolve(reference, resource) {
                Some((target, target_resource)) => {
                    self.generate(target, target_resource, depth + 1)
                }
                None => Value::Null,
            };
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = s.get(key).and_then(Value::as_array) {
                // Prefer an alternative that is not plain null: it exercises the consumer more.
                let chosen = options
                    .iter()
                    .find(|o| o.get("type").and_then(Value::as_str) != Some("null"))
                    .or_else(|| options.first());
                if let Some(option) = chosen {
                    return self.generate(option, resource, depth + 1);
                }
            }
        }
        if let Some(parts) = s.get("allOf").and_then(Value::as_array) {
            let mut merged = Map::new();
            let mut last = Value::Null;
            for part in parts {
                match self.generate(part, resource, depth + 1) {
                    Value::Object(fields) => merged.extend(fields),
                    other => last = other,
                }
            }
            return if merged.is_empty() {
                last
            } else {
                Value::Object(merged)
            };
        }
        match type_of(s) {
            "object" => self.object(s, resource, depth),
            "array" => self.array(s, resource, depth),
            "string" => string(s),
            "integer" => integer(s),
            "number" => number(s),
            "boolean" => Value::Bool(true),
            "null" => Value::Null,
            _ => Value::String("mock".to_owned()),
        }
    }

    fn object(&self, s: &'a Map<String, Value>, resource: &'a Value, depth: usize) -> Value {
        let mut out = Map::new();
        let properties = s.get("properties").and_then(Value::as_object);
        let required = s.get("required").and_then(Value::as_array);
        for name in required.into_iter().flatten().filter_map(Value::as_str) {
            let value = match properties.and_then(|p| p.get(name)) {
                Some(prop) => self.generate(prop, resource, depth + 1),
                None => match s.get("additionalProperties") {
                    Some(extra @ Value::Object(_)) => self.generate(extra, resource, depth + 1),
                    _ => Value::String("mock".to_owned()),
                },
            };
            out.insert(name.to_owned(), value);
        }
        Value::Object(out)
    }

    fn array(&self, s: &'a Map<String, Value>, resource: &'a Value, depth: usize) -> Value {
        let mut items = Vec::new();
        if let Some(prefix) = s.get("prefixItems").and_then(Value::as_array) {
            for item in prefix {
                items.push(self.generate(item, resource, depth + 1));
            }
        }
        let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let max = s
            .get("maxItems")
            .and_then(Value::as_u64)
            .unwrap_or(u64::MAX);
        let unique = s.get("uniqueItems").and_then(Value::as_bool) == Some(true);
        // One item (when allowed) shows the consumer a non-empty list.
        let wanted = min
            .max(1)
            .min(max)
            .min(if unique { 1.max(min) } else { 64 }) as usize;
        if let Some(item) = s.get("items").filter(|i| i.is_object()) {
            while items.len() < wanted {
                items.push(self.generate(item, resource, depth + 1));
            }
        }
        Value::Array(items)
    }

    /// Resolves `#`, `#/json/pointer` (against the current resource) and `#/$defs/..` of the
    /// root; returns the target and its resource.
    fn resolve(&self, reference: &str, resource: &'a Value) -> Option<(&'a Value, &'a Value)> {
        let pointer = reference.strip_prefix('#')?;
        if pointer.is_empty() {
            return Some((resource, resource));
        }
        let decoded = pointer.replace("~1", "/").replace("~0", "~");
        if let Some(found) = resource.pointer(&decoded) {
            return Some((found, resource));
        }
        self.root.pointer(&decoded).map(|found| (found, self.root))
    }
}

/// The type to generate: the first non-null of `type`, else inferred from the keywords.
fn type_of(s: &Map<String, Value>) -> &str {
    match s.get("type") {
        Some(Value::String(t)) => t,
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .or_else(|| types.iter().filter_map(Value::as_str).next())
            .unwrap_or(""),
        _ if s.contains_key("properties") || s.contains_key("required") => "object",
        _ if s.contains_key("items") || s.contains_key("prefixItems") => "array",
        _ => "",
    }
}

fn string(s: &Map<String, Value>) -> Value {
    let text = match s.get("format").and_then(Value::as_str) {
        Some("date-time") => "2024-01-01T00:00:00Z",
        Some("date") => "2024-01-01",
        Some("time") => "00:00:00Z",
        Some("email") => "mock@example.com",
        Some("uri" | "url") => "https://example.com/",
        Some("uuid") => "00000000-0000-4000-8000-000000000000",
        _ => "mock",
    };
    let min = s.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
    let max = s
        .get("maxLength")
        .and_then(Value::as_u64)
        .map_or(usize::MAX, |m| m as usize);
    let mut out: String = text.chars().take(max).collect();
    while out.chars().count() < min {
        out.push('x');
    }
    Value::String(out)
}

fn integer(s: &Map<String, Value>) -> Value {
    let mut value: i64 = 1;
    if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
        value = value.max(min.ceil() as i64);
    }
    if let Some(min) = s.get("exclusiveMinimum").and_then(Value::as_f64) {
        value = value.max(min.floor() as i64 + 1);
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
        value = value.min(max.floor() as i64);
    }
    if let Some(max) = s.get("exclusiveMaximum").and_then(Value::as_f64) {
        value = value.min(max.ceil() as i64 - 1);
    }
    Value::Number(Number::from(value))
}

fn number(s: &Map<String, Value>) -> Value {
    let mut value = 1.0_f64;
    if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
        value = value.max(min);
    }
    if let Some(min) = s.get("exclusiveMinimum").and_then(Value::as_f64) {
        value = value.max(min + 0.5);
    }
    if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
        value = value.min(max);
    }
    if let Some(max) = s.get("exclusiveMaximum").and_then(Value::as_f64) {
        value = value.min(max - 0.5);
    }
    Number::from_f64(value).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn required_props_types_enums_and_refs() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 6},
                "mode": {"type": "string", "enum": ["low", "high"]},
                "count": {"type": "integer", "minimum": 3, "maximum": 10},
                "flag": {"type": ["boolean", "null"]},
                "plan": {"$ref": "#/$defs/Plan"},
                "optional": {"type": "string"}
            },
            "required": ["name", "mode", "count", "flag", "plan"],
            "$defs": {
                "Plan": {
                    "type": "object",
                    "properties": {"phases": {"type": "array", "items": {"$ref": "#/$defs/Phase"}}},
                    "required": ["phases"]
                },
                "Phase": {
                    "type": "object",
                    "properties": {"agents": {"type": "array", "items": {"type": "string"}}},
                    "required": ["agents"]
                }
            }
        });
        let value = instance(&schema);
        assert_eq!(value["name"], "mockxx");
        assert_eq!(value["mode"], "low");
        assert_eq!(value["count"], 3);
        assert_eq!(value["flag"], true);
        assert_eq!(value["plan"]["phases"][0]["agents"][0], "mock");
        assert!(value.get("optional").is_none());
    }

    #[test]
    fn recursive_schemas_stop() {
        let schema = json!({"$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}, "required": ["n"]}}, "$ref": "#/$defs/N"});
        let value = instance(&schema);
        assert!(value.is_object());
    }
}
