//! A small structural validator for the subset of JSON Schema the published artifact schemas use:
//! `type` (one or several), `required`, `properties`, `additionalProperties` (boolean or schema),
//! `items`, `enum`, `const`, `minimum`, `maximum`, `pattern` (anchored sequences of literals and
//! bracket classes with `{n}`/`{m,n}` counts — what the schemas use), `anyOf`/`oneOf`/`allOf`,
//! and local `$ref`
//! (`#/definitions/…`, `#/$defs/…`). Other keywords are ignored and listed, so a schema relying on
//! them is visibly not fully checked. Kept in-house to avoid a heavy dependency for a test-time
//! check.

use std::collections::BTreeSet;

use serde_json::Value;

/// Keywords this validator understands (plus annotations it may ignore silently).
const KNOWN: &[&str] = &[
    "type",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "minimum",
    "maximum",
    "pattern",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "definitions",
    "$defs",
    "default",
    "examples",
    "format",
];

/// The result of validating one document.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Validation {
    /// `path: message` for every violation.
    pub errors: Vec<String>,
    /// Keywords present in the schema that this validator does not check.
    pub ignored_keywords: BTreeSet<String>,
}

impl Validation {
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Validate `doc` against `schema`.
pub fn validate(schema: &Value, doc: &Value) -> Validation {
    let mut v = Validation::default();
    check(schema, schema, doc, "$", &mut v, 0);
    v
}

fn type_matches(t: &str, doc: &Value) -> bool {
    match t {
        "null" => doc.is_null(),
        "boolean" => doc.is_boolean(),
        "object" => doc.is_object(),
        "array" => doc.is_array(),
        "string" => doc.is_string(),
        "number" => doc.is_number(),
        "integer" => doc.as_i64().is_some() || doc.as_u64().is_some(),
        _ => false,
    }
}

fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    root.pointer(pointer)
}

fn check(root: &Value, schema: &Value, doc: &Value, path: &str, v: &mut Validation, depth: usize) {
    if depth > 64 {
        v.errors
            .push(format!("{path}: schema nesting too deep (recursive $ref?)"));
        return;
    }
    let Some(obj) = schema.as_object() else {
        // `true` accepts everything; `false` nothing.
        if schema == &Value::Bool(false) {
            v.errors.push(format!("{path}: not allowed"));
        }
        return;
    };
    for k in obj.keys() {
        if !KNOWN.contains(&k.as_str()) {
            v.ignored_keywords.insert(k.clone());
        }
    }
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        match resolve(root, r) {
            Some(target) => check(root, target, doc, path, v, depth + 1),
            None => v.errors.push(format!("{path}: unresolvable $ref {r}")),
        }
    }
    if let Some(t) = obj.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !types.is_empty() && !types.iter().any(|t| type_matches(t, doc)) {
            v.errors.push(format!(
                "{path}: expected type {}, found {}",
                types.join("|"),
                kind(doc)
            ));
            return;
        }
    }
    if let Some(options) = obj.get("enum").and_then(Value::as_array) {
        if !options.contains(doc) {
            v.errors.push(format!(
                "{path}: {doc} is not one of {}",
                Value::Array(options.clone())
            ));
        }
    }
    if let Some(c) = obj.get("const") {
        if c != doc {
            v.errors.push(format!("{path}: expected {c}, found {doc}"));
        }
    }
    if let (Some(min), Some(n)) = (obj.get("minimum").and_then(Value::as_f64), doc.as_f64()) {
        if n < min {
            v.errors
                .push(format!("{path}: {n} is below the minimum {min}"));
        }
    }
    if let (Some(max), Some(n)) = (obj.get("maximum").and_then(Value::as_f64), doc.as_f64()) {
        if n > max {
            v.errors
                .push(format!("{path}: {n} is above the maximum {max}"));
        }
    }
    if let (Some(pattern), Some(text)) = (obj.get("pattern").and_then(Value::as_str), doc.as_str())
    {
        match pattern_matches(pattern, text) {
            Some(true) => {}
            Some(false) => v
                .errors
                .push(format!("{path}: {text:?} does not match {pattern}")),
            None => {
                v.ignored_keywords.insert(format!("pattern {pattern}"));
            }
        }
    }
    if let Some(map) = doc.as_object() {
        if let Some(req) = obj.get("required").and_then(Value::as_array) {
            for name in req.iter().filter_map(Value::as_str) {
                if !map.contains_key(name) {
                    v.errors
                        .push(format!("{path}: missing required property `{name}`"));
                }
            }
        }
        let props = obj.get("properties").and_then(Value::as_object);
        for (k, val) in map {
            let child = format!("{path}.{k}");
            match props.and_then(|p| p.get(k)) {
                Some(s) => check(root, s, val, &child, v, depth + 1),
                None => match obj.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        v.errors.push(format!("{path}: unexpected property `{k}`"))
                    }
                    Some(s @ Value::Object(_)) => check(root, s, val, &child, v, depth + 1),
                    _ => {}
                },
            }
        }
    }
    if let (Some(items), Some(arr)) = (obj.get("items"), doc.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            check(root, items, item, &format!("{path}[{i}]"), v, depth + 1);
        }
    }
    if let Some(all) = obj.get("allOf").and_then(Value::as_array) {
        for s in all {
            check(root, s, doc, path, v, depth + 1);
        }
    }
    for (key, exactly_one) in [("anyOf", false), ("oneOf", true)] {
        if let Some(alts) = obj.get(key).and_then(Value::as_array) {
            let mut matching = 0;
            for s in alts {
                let mut sub = Validation::default();
                check(root, s, doc, path, &mut sub, depth + 1);
                v.ignored_keywords.extend(sub.ignored_keywords);
                if sub.errors.is_empty() {
                    matching += 1;
                }
            }
            let ok = if exactly_one {
                matching == 1
            } else {
                matching >= 1
            };
            if !ok {
                v.errors.push(format!(
                    "{path}: matches {matching} of the {key} alternatives"
                ));
            }
        }
    }
}

fn kind(doc: &Value) -> &'static str {
    match doc {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// One element of an anchored pattern: a set of characters and how many times it repeats.
struct Atom {
    chars: Vec<(char, char)>,
    min: usize,
    max: usize,
}

/// Parses `^…$` made of literal characters and `[…]` classes (ranges allowed), each optionally
/// followed by `{n}` or `{m,n}`. `None` for anything else: the caller reports it unchecked.
fn parse_pattern(pattern: &str) -> Option<Vec<Atom>> {
    let body = pattern.strip_prefix('^')?.strip_suffix('$')?;
    let chars: Vec<char> = body.chars().collect();
    let mut atoms = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let mut set = Vec::new();
        match chars[i] {
            '[' => {
                i += 1;
                while i < chars.len() && chars[i] != ']' {
                    let lo = chars[i];
                    if i + 2 < chars.len() && chars[i + 1] == '-' && chars[i + 2] != ']' {
                        set.push((lo, chars[i + 2]));
                        i += 3;
                    } else {
                        set.push((lo, lo));
                        i += 1;
                    }
                }
                if i >= chars.len() {
                    return None;
                }
                i += 1;
            }
            '\\' | '(' | ')' | '|' | '*' | '+' | '?' | '.' | '{' => return None,
            c => {
                set.push((c, c));
                i += 1;
            }
        }
        let (mut min, mut max) = (1, 1);
        if i < chars.len() && chars[i] == '{' {
            let close = chars[i..].iter().position(|c| *c == '}')? + i;
            let spec: String = chars[i + 1..close].iter().collect();
            let (lo, hi) = match spec.split_once(',') {
                Some((lo, hi)) => (lo.parse().ok()?, hi.parse().ok()?),
                None => {
                    let n = spec.parse().ok()?;
                    (n, n)
                }
            };
            min = lo;
            max = hi;
            i = close + 1;
        }
        atoms.push(Atom {
            chars: set,
            min,
            max,
        });
    }
    Some(atoms)
}

fn pattern_matches(pattern: &str, text: &str) -> Option<bool> {
    let atoms = parse_pattern(pattern)?;
    let text: Vec<char> = text.chars().collect();
    // Greedy is exact here: consecutive atoms in the schemas never share characters, and a
    // mismatch is still a mismatch (no backtracking needed for these anchored sequences).
    let mut pos = 0;
    for atom in &atoms {
        let mut n = 0;
        while n < atom.max
            && pos < text.len()
            && atom
                .chars
                .iter()
                .any(|(lo, hi)| (*lo..=*hi).contains(&text[pos]))
        {
            n += 1;
            pos += 1;
        }
        if n < atom.min {
            return Some(false);
        }
    }
    Some(pos == text.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "required": ["backend", "exit"],
            "additionalProperties": false,
            "properties": {
                "backend": {"type": "string"},
                "level": {"enum": ["observed", "enforced"]},
                "exit": {"$ref": "#/$defs/exit"},
                "argv": {"type": ["array", "null"], "items": {"type": "string"}},
                "n": {"type": "integer", "minimum": 0},
                "alt": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                "pat": {"type": "string", "pattern": "^x"}
            },
            "$defs": {"exit": {"type": "object", "required": ["code"], "properties": {"code": {"type": ["integer", "null"]}}}}
        })
    }

    #[test]
    fn accepts_a_valid_document() {
        let doc = json!({"backend": "local", "level": "observed", "exit": {"code": null}, "argv": ["a"], "n": 3, "alt": 1});
        let v = validate(&schema(), &doc);
        assert!(v.is_valid(), "{:?}", v.errors);
    }

    #[test]
    fn reports_each_violation_with_its_path() {
        let doc =
            json!({"level": "bogus", "exit": {}, "argv": [1], "n": -1, "alt": true, "extra": 1});
        let v = validate(&schema(), &doc);
        let all = v.errors.join("\n");
        for expected in [
            "$: missing required property `backend`",
            "$.level: \"bogus\" is not one of",
            "$.exit: missing required property `code`",
            "$.argv[0]: expected type string, found number",
            "$.n: -1 is below the minimum 0",
            "$.alt: matches 0 of the oneOf alternatives",
            "$: unexpected property `extra`",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in\n{all}");
        }
    }

    #[test]
    fn lists_keywords_it_does_not_check() {
        let v = validate(
            &schema(),
            &json!({"backend": "x", "exit": {"code": 1}, "pat": "y"}),
        );
        assert!(v.is_valid());
        // An unanchored pattern is outside the subset: listed as unchecked, not passed off.
        assert!(v.ignored_keywords.contains("pattern ^x"), "{v:?}");
    }

    #[test]
    fn the_compiled_in_runtime_schema_parses_and_rejects_an_empty_document() {
        let schema: Value = serde_json::from_str(crate::RUNTIME_SCHEMA).unwrap();
        let v = validate(&schema, &json!({}));
        assert!(
            v.errors.iter().any(|e| e.contains("`launched`")),
            "{:?}",
            v.errors
        );
    }

    #[test]
    fn unresolvable_refs_are_errors() {
        let v = validate(&json!({"$ref": "#/$defs/none"}), &json!(1));
        assert!(!v.is_valid());
    }

    #[test]
    fn anchored_patterns_used_by_the_schemas() {
        let hex = "^[0-9a-f]{64}$";
        assert_eq!(pattern_matches(hex, &"a".repeat(64)), Some(true));
        assert_eq!(pattern_matches(hex, &"a".repeat(63)), Some(false));
        assert_eq!(pattern_matches(hex, &"A".repeat(64)), Some(false));
        let fp = "^sha256:[0-9a-f]{16}$";
        assert_eq!(pattern_matches(fp, "sha256:0123456789abcdef"), Some(true));
        assert_eq!(pattern_matches(fp, "sha256:0123456789abcde"), Some(false));
        assert_eq!(pattern_matches(fp, "sha1:0123456789abcdef"), Some(false));
        let ev = "^[a-z0-9_.]{1,64}$";
        assert_eq!(pattern_matches(ev, "rollback_started"), Some(true));
        assert_eq!(pattern_matches(ev, ""), Some(false));
        assert_eq!(pattern_matches(ev, "Bad"), Some(false));
        assert_eq!(pattern_matches("^(a|b)$", "a"), None);
        let schema = serde_json::json!({"type": "integer", "maximum": 100});
        assert!(!validate(&schema, &serde_json::json!(101)).is_valid());
        assert!(validate(&schema, &serde_json::json!(100)).is_valid());
    }
}
