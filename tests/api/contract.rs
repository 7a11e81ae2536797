//! The API contract under a property-based fuzzer: requests are
//! generated from the published OpenAPI document itself (every operation,
//! every parameter, every body schema), valid and invalid by the schema, and
//! sent to a real server. The oracle is the document too: a request whose
//! every part validates against its schema never gets 400, one with an
//! invalid part never gets 2xx, and every answer validates against the
//! document's schema for its status. Path parameters and fences come, part
//! of the time, from earlier answers through the document's `links`, so the
//! 200 paths of read, convert, cancel and end are walked as well.
//!
//! The generator covers the JSON Schema subset the document uses and panics
//! on any other keyword: a document that grows a keyword grows the fuzzer.

use std::collections::BTreeMap;
use std::time::Instant;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::{BoxedStrategy, Union};
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use serde_json::{Map, Value, json};

use crate::helpers::{TestApp, spawn_app};
use crate::openapi::{Conformance, escape_pointer, validator_at};

// ---------------------------------------------------------------------------
// The document, read as operations
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Location {
    Path,
    Query,
}

#[derive(Clone, Debug)]
struct Param {
    name: String,
    location: Location,
    required: bool,
    /// JSON pointer of the parameter's schema.
    schema: String,
}

#[derive(Clone, Debug)]
struct Operation {
    id: String,
    method: String,
    path: String,
    params: Vec<Param>,
    /// JSON pointer of the JSON body's schema, and whether it is required.
    body: Option<(String, bool)>,
}

fn resolve_ref<'a>(doc: &'a Value, v: &'a Value) -> (&'a Value, String) {
    let r = v["$ref"].as_str().expect("a $ref");
    let pointer = r.trim_start_matches('#').to_owned();
    (
        doc.pointer(&pointer)
            .unwrap_or_else(|| panic!("{r} resolves")),
        pointer,
    )
}

fn operations(doc: &Value) -> Vec<Operation> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let base = format!("/paths/{}", escape_pointer(path));
        for method in ["get", "put", "post", "patch", "delete"] {
            let Some(op) = item.get(method) else {
                continue;
            };
            let mut params = Vec::new();
            let lists = [
                (format!("{base}/parameters"), item.get("parameters")),
                (format!("{base}/{method}/parameters"), op.get("parameters")),
            ];
            for (list_pointer, list) in lists {
                for (i, p) in list
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let (p, pointer) = if p.get("$ref").is_some() {
                        resolve_ref(doc, p)
                    } else {
                        (p, format!("{list_pointer}/{i}"))
                    };
                    let location = match p["in"].as_str() {
                        Some("path") => Location::Path,
                        Some("query") => Location::Query,
                        other => panic!("parameters in {other:?}: extend the fuzzer"),
                    };
                    params.push(Param {
                        name: p["name"].as_str().expect("name").to_owned(),
                        location,
                        required: p["required"].as_bool().unwrap_or(false),
                        schema: format!("{pointer}/schema"),
                    });
                }
            }
            let body = op.get("requestBody").map(|b| {
                let content = b["content"].as_object().expect("content");
                assert_eq!(
                    content.keys().collect::<Vec<_>>(),
                    ["application/json"],
                    "{method} {path}: JSON bodies only; extend the fuzzer"
                );
                (
                    format!("{base}/{method}/requestBody/content/application~1json/schema"),
                    b["required"].as_bool().unwrap_or(false),
                )
            });
            ops.push(Operation {
                id: op["operationId"].as_str().expect("operationId").to_owned(),
                method: method.to_owned(),
                path: path.clone(),
                params,
                body,
            });
        }
    }
    ops
}

// ---------------------------------------------------------------------------
// Values from schemas
// ---------------------------------------------------------------------------

/// The keywords the generator understands; anything else fails the test.
const KNOWN: &[&str] = &[
    "$ref",
    "anyOf",
    "oneOf",
    "const",
    "enum",
    "type",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "format",
    "properties",
    "required",
    "additionalProperties",
    "description",
    "examples",
    "default",
    "items",
    "minItems",
    "maxItems",
    "uniqueItems",
];

fn check_keywords(schema: &Value) {
    for k in schema.as_object().expect("a schema object").keys() {
        assert!(
            KNOWN.contains(&k.as_str()),
            "the document uses `{k}`, which the fuzzer does not generate yet: extend tests/api/contract.rs"
        );
    }
}

/// The rules of a body that relate two of its fields, which JSON Schema
/// cannot say and the document says in words: false when `body` breaks
/// one (the API answers `400`).
fn beyond_the_schema(op: &str, body: &Value) -> bool {
    match op {
        // R20: a profile is never its own substitute.
        "putSubstitutes" => body["substitutes"]
            .as_array()
            .is_none_or(|list| !list.contains(&body["profile"])),
        _ => true,
    }
}

fn types(schema: &Value) -> Vec<String> {
    match &schema["type"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

fn usize_kw(schema: &Value, k: &str) -> Option<usize> {
    schema[k].as_u64().map(|n| n as usize)
}

/// Repeats the characters of `s` until it is `n` characters long (a
/// pattern made of one character class still matches).
fn stretch(s: &str, n: usize) -> String {
    if s.is_empty() {
        return "a".repeat(n);
    }
    s.chars().cycle().take(n).collect()
}

fn union(options: Vec<BoxedStrategy<Value>>) -> BoxedStrategy<Value> {
    Union::new(options).boxed()
}

/// The pattern without its anchors, for proptest's regex generator.
fn unanchored(pattern: &str) -> String {
    let p = pattern.strip_prefix('^').unwrap_or(pattern);
    p.strip_suffix('$').unwrap_or(p).to_owned()
}

/// Values meant to be valid for `schema` (the validator has the last word).
fn valid(doc: &Value, schema: &Value) -> BoxedStrategy<Value> {
    check_keywords(schema);
    let base = if schema.get("$ref").is_some() {
        valid(doc, resolve_ref(doc, schema).0)
    } else if let Some(branches) = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
    {
        union(branches.iter().map(|b| valid(doc, b)).collect())
    } else if let Some(c) = schema.get("const") {
        Just(c.clone()).boxed()
    } else if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        prop::sample::select(e.clone()).boxed()
    } else {
        let ts = types(schema);
        assert!(!ts.is_empty(), "a schema without a type: {schema}");
        union(ts.iter().map(|t| valid_of_type(doc, schema, t)).collect())
    };
    match schema.get("examples").and_then(Value::as_array) {
        Some(examples) if !examples.is_empty() => {
            prop_oneof![1 => prop::sample::select(examples.clone()), 1 => base].boxed()
        }
        _ => base,
    }
}

fn bounds(schema: &Value) -> (i64, i64) {
    (
        schema["minimum"].as_i64().unwrap_or(i64::MIN),
        schema["maximum"].as_i64().unwrap_or(i64::MAX),
    )
}

/// Below 2^53 a float holds an integer exactly.
const EXACT: u64 = 1 << 53;

fn valid_of_type(doc: &Value, schema: &Value, t: &str) -> BoxedStrategy<Value> {
    match t {
        "null" => Just(Value::Null).boxed(),
        "boolean" => any::<bool>().prop_map(Value::from).boxed(),
        "string" => {
            let min = usize_kw(schema, "minLength").unwrap_or(0);
            let max = usize_kw(schema, "maxLength");
            let plain = match schema["pattern"].as_str() {
                Some(p) => proptest::string::string_regex(&unanchored(p))
                    .unwrap_or_else(|e| panic!("pattern {p}: {e}"))
                    .boxed(),
                None => proptest::string::string_regex(&format!(
                    "\\PC{{{min},{}}}",
                    max.unwrap_or(40).min(min + 40)
                ))
                .expect("regex")
                .boxed(),
            };
            let plain = plain
                .prop_filter("within the length bounds", move |s| {
                    let n = s.chars().count();
                    n >= min && max.is_none_or(|m| n <= m)
                })
                .boxed();
            match max {
                // Also exactly at the upper bound.
                Some(m) => prop_oneof![
                    4 => plain.clone().prop_map(Value::from),
                    1 => plain.prop_map(move |s| Value::from(stretch(&s, m))),
                ]
                .boxed(),
                None => plain.prop_map(Value::from).boxed(),
            }
        }
        "integer" => {
            let (lo, hi) = bounds(schema);
            // Small values often: only they have an exact float form.
            let (a, b) = (lo.max(-1000), hi.min(1000).max(lo.max(-1000)));
            let n = prop_oneof![1 => Just(lo), 1 => Just(hi), 1 => lo..=hi, 3 => a..=b];
            // Sometimes in its float form, 40121.0: the same integer.
            (n, prop::bool::weighted(0.25))
                .prop_map(|(n, float)| {
                    if float && n.unsigned_abs() < EXACT {
                        Value::from(n as f64)
                    } else {
                        Value::from(n)
                    }
                })
                .boxed()
        }
        "object" => {
            let required: Vec<String> = schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
            let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = schema["properties"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, s)| {
                    let k = k.clone();
                    let v = valid(doc, s);
                    if required.contains(&k) {
                        v.prop_map(move |v| Some((k.clone(), v))).boxed()
                    } else {
                        prop::option::of(v.prop_map(move |v| (k.clone(), v))).boxed()
                    }
                })
                .collect();
            fields
                .prop_map(|fields| Value::Object(fields.into_iter().flatten().collect()))
                .boxed()
        }
        "array" => {
            let min = usize_kw(schema, "minItems").unwrap_or(0);
            let max = usize_kw(schema, "maxItems").unwrap_or(min + 4);
            // Mostly short lists; sometimes exactly at the upper bound.
            let short = prop::collection::vec(valid(doc, &schema["items"]), min..=max.min(min + 3));
            let lists = prop_oneof![
                4 => short,
                1 => prop::collection::vec(valid(doc, &schema["items"]), max..=max),
            ];
            if schema["uniqueItems"] == json!(true) {
                // A repeat dropped (the first kept): still within the bounds
                // unless that falls below minItems, which is then rejected.
                lists
                    .prop_map(|v| {
                        let mut unique: Vec<Value> = Vec::new();
                        for x in v {
                            if !unique.contains(&x) {
                                unique.push(x);
                            }
                        }
                        unique
                    })
                    .prop_filter("minItems after dropping repeats", move |v| v.len() >= min)
                    .prop_map(Value::from)
                    .boxed()
            } else {
                lists.prop_map(Value::from).boxed()
            }
        }
        other => panic!("type {other}: extend the fuzzer"),
    }
}

/// Values of JSON types `schema` does not allow (or, for schemas without a
/// type, of every type: the validator sorts them out).
fn wrong_type(schema: &Value) -> BoxedStrategy<Value> {
    let ts = types(schema);
    let all = [
        ("null", Value::Null),
        ("boolean", json!(true)),
        ("integer", json!(7)),
        ("number", json!(1.5)),
        ("string", json!("text")),
        ("array", json!([1])),
        ("object", json!({"k": 1})),
    ];
    let others: Vec<Value> = all
        .into_iter()
        .filter(|(t, _)| {
            !ts.iter()
                .any(|x| x == t || (x == "number" && *t == "integer"))
        })
        .map(|(_, v)| v)
        .collect();
    prop::sample::select(others).boxed()
}

/// Characters outside every pattern of the document but the reason's.
const BAD_CHARS: &[&str] = &[" ", "/", "é", "\u{0}", "%", "\n", "\u{7f}", "?", "#"];

/// Values meant to be invalid for `schema`, one rule broken at a time.
fn invalid(doc: &Value, schema: &Value) -> BoxedStrategy<Value> {
    check_keywords(schema);
    if schema.get("$ref").is_some() {
        return invalid(doc, resolve_ref(doc, schema).0);
    }
    let mut options = vec![wrong_type(schema)];
    if let Some(branches) = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
    {
        options.extend(branches.iter().map(|b| invalid(doc, b)));
    }
    if schema.get("enum").is_some() || schema.get("const").is_some() {
        options.push(Just(json!("not-one-of-them")).boxed());
    }
    let ts = types(schema);
    if ts.iter().any(|t| t == "string") {
        let min = usize_kw(schema, "minLength").unwrap_or(0);
        if min > 0 {
            options.push(Just(json!("a".repeat(min - 1))).boxed());
        }
        if let Some(max) = usize_kw(schema, "maxLength") {
            options.push(
                valid(doc, schema)
                    .prop_map(move |v| json!(stretch(v.as_str().unwrap_or("a"), max + 1)))
                    .boxed(),
            );
        }
        if schema.get("pattern").is_some() {
            options.push(
                (
                    valid(doc, schema),
                    prop::sample::select(BAD_CHARS),
                    any::<Index>(),
                )
                    .prop_map(|(v, bad, at)| {
                        let s = v.as_str().unwrap_or("").to_owned();
                        let chars: Vec<char> = s.chars().collect();
                        let at = at.index(chars.len() + 1);
                        let mut out: String = chars[..at].iter().collect();
                        out.push_str(bad);
                        out.extend(&chars[at..]);
                        json!(out)
                    })
                    .boxed(),
            );
        }
    }
    if ts.iter().any(|t| t == "integer") {
        let (lo, hi) = bounds(schema);
        let mut out_of_range = Vec::new();
        if lo > i64::MIN {
            out_of_range.push(json!(lo - 1));
        }
        out_of_range.push(if hi < i64::MAX {
            json!(hi + 1)
        } else {
            json!(i64::MAX as u64 + 1)
        });
        options.push(prop::sample::select(out_of_range).boxed());
        // A fraction, and the number as a string.
        let (a, b) = (lo.clamp(-1000, 1000), hi.clamp(-1000, 1000));
        options.push((a..=b).prop_map(|n| json!(n as f64 + 0.5)).boxed());
        options.push((a..=b).prop_map(|n| json!(n.to_string())).boxed());
    }
    if ts.iter().any(|t| t == "array") {
        let items = schema["items"].clone();
        if let Some(min) = usize_kw(schema, "minItems").filter(|m| *m > 0) {
            options.push(
                prop::collection::vec(valid(doc, &items), min - 1..=min - 1)
                    .prop_map(Value::from)
                    .boxed(),
            );
        }
        if let Some(max) = usize_kw(schema, "maxItems") {
            options.push(
                prop::collection::vec(valid(doc, &items), max + 1..=max + 1)
                    .prop_map(Value::from)
                    .boxed(),
            );
        }
        if schema["uniqueItems"] == json!(true) {
            // An item repeated.
            options.push(
                valid(doc, &items)
                    .prop_map(|x| Value::from(vec![x.clone(), x]))
                    .boxed(),
            );
        }
        // One item broken, among valid ones.
        options.push(
            (
                prop::collection::vec(valid(doc, &items), 0..=2),
                invalid(doc, &items),
            )
                .prop_map(|(mut v, bad)| {
                    v.push(bad);
                    Value::from(v)
                })
                .boxed(),
        );
    }
    if ts.iter().any(|t| t == "object") {
        let required: Vec<String> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        if !required.is_empty() {
            options.push(
                (valid(doc, schema), prop::sample::select(required))
                    .prop_map(|(mut v, k)| {
                        if let Value::Object(m) = &mut v {
                            m.remove(&k);
                        }
                        v
                    })
                    .boxed(),
            );
        }
        if schema["additionalProperties"] == json!(false) {
            options.push(
                valid(doc, schema)
                    .prop_map(|mut v| {
                        if let Value::Object(m) = &mut v {
                            m.insert("unexpected".into(), json!(1));
                        }
                        v
                    })
                    .boxed(),
            );
        }
        for (k, s) in schema["properties"].as_object().into_iter().flatten() {
            let k = k.clone();
            options.push(
                (valid(doc, schema), invalid(doc, s))
                    .prop_map(move |(mut v, bad)| {
                        if let Value::Object(m) = &mut v {
                            m.insert(k.clone(), bad);
                        }
                        v
                    })
                    .boxed(),
            );
        }
    }
    union(options)
}

// ---------------------------------------------------------------------------
// Parameters as text
// ---------------------------------------------------------------------------

/// Whether `schema` admits integers (then `42` in a URL is the number 42).
fn admits_integer(doc: &Value, schema: &Value) -> bool {
    if schema.get("$ref").is_some() {
        return admits_integer(doc, resolve_ref(doc, schema).0);
    }
    let branch = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
        .is_some_and(|bs| bs.iter().any(|b| admits_integer(doc, b)));
    branch
        || types(schema)
            .iter()
            .any(|t| t == "integer" || t == "number")
}

/// An integer in a URL is written in digits (the server's rule, docs/api.md).
fn canonical_integer(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
}

/// The JSON instance a parameter's text stands for.
fn instance(doc: &Value, schema: &Value, text: &str) -> Value {
    if admits_integer(doc, schema) && canonical_integer(text) {
        serde_json::from_str(text).unwrap_or_else(|_| json!(text))
    } else {
        json!(text)
    }
}

fn to_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn valid_text(doc: &Value, schema: &Value) -> BoxedStrategy<String> {
    valid(doc, schema)
        .prop_map(|v| match v {
            // Written in digits, as a client serializes an integer.
            Value::Number(n)
                if n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9e15) =>
            {
                (n.as_f64().unwrap_or(0.0) as i64).to_string()
            }
            other => to_text(&other),
        })
        .boxed()
}

fn invalid_text(doc: &Value, schema: &Value) -> BoxedStrategy<String> {
    let plain = invalid(doc, schema).prop_map(|v| to_text(&v)).boxed();
    if !admits_integer(doc, schema) {
        return plain;
    }
    // Other spellings of a valid integer: a fraction part, a sign, a zero.
    let spelled = (
        valid_text(doc, schema),
        prop::sample::select(vec!["{}.0", "+{}", "0{}", " {}", "{}e0"]),
    )
        .prop_map(|(n, form)| form.replace("{}", &n))
        .boxed();
    prop_oneof![3 => plain, 1 => spelled].boxed()
}

/// Every byte but the unreserved ones percent-encoded, for a path segment.
fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Case {
    /// Per parameter of the operation: its text, or absent.
    params: Vec<Option<String>>,
    body: Option<Value>,
    /// The part generated to break the schema (parameters, then the body).
    broken: Option<usize>,
    /// Which answer of an earlier call, through a link, supplies values.
    link: Option<Index>,
    /// Whether integers from the link go in the body in their float form
    /// (`"fence": 227.0`).
    floats: bool,
}

fn case(doc: &Value, op: &Operation) -> BoxedStrategy<Case> {
    let schema = |p: &str| doc.pointer(p).expect("schema").clone();
    let good: Vec<BoxedStrategy<Option<String>>> = op
        .params
        .iter()
        .map(|p| {
            let v = valid_text(doc, &schema(&p.schema));
            if p.required {
                v.prop_map(Some).boxed()
            } else {
                prop::option::of(v).boxed()
            }
        })
        .collect();
    let bad: Vec<BoxedStrategy<Option<String>>> = op
        .params
        .iter()
        .map(|p| {
            let v = invalid_text(doc, &schema(&p.schema));
            if p.required && p.location == Location::Query {
                // Missing is a way of being invalid, too.
                prop_oneof![4 => v.prop_map(Some), 1 => Just(None)].boxed()
            } else {
                v.prop_map(Some).boxed()
            }
        })
        .collect();
    let body: BoxedStrategy<(Option<Value>, Option<Value>)> = match &op.body {
        Some((pointer, _)) => {
            let s = schema(pointer);
            (
                valid(doc, &s).prop_map(Some),
                prop_oneof![9 => invalid(doc, &s).prop_map(Some), 1 => Just(None)],
            )
                .boxed()
        }
        None => Just((None, None)).boxed(),
    };
    let parts = op.params.len() + usize::from(op.body.is_some());
    (
        good,
        bad,
        body,
        prop::option::weighted(0.5, 0..parts.max(1)),
        prop::option::weighted(0.6, any::<Index>()),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            move |(good, bad, (good_body, bad_body), broken, link, floats)| {
                let broken = broken.filter(|_| parts > 0);
                let params = good
                    .into_iter()
                    .zip(bad)
                    .enumerate()
                    .map(|(i, (g, b))| if broken == Some(i) { b } else { g })
                    .collect::<Vec<_>>();
                let n = params.len();
                Case {
                    body: if broken == Some(n) {
                        bad_body
                    } else {
                        good_body
                    },
                    params,
                    broken,
                    link,
                    floats,
                }
            },
        )
        .boxed()
}

/// Values for one operation, evaluated from an earlier answer by a link.
#[derive(Clone, Debug)]
struct Binding {
    /// The answer it came from (to drop its siblings once it is spent).
    source: usize,
    params: Map<String, Value>,
    body: Map<String, Value>,
}

/// `$response.body#/pointer`, or a literal; in an array, each item.
fn evaluate(expr: &Value, answer: &Value) -> Option<Value> {
    if let Value::Array(items) = expr {
        return items
            .iter()
            .map(|i| evaluate(i, answer))
            .collect::<Option<Vec<_>>>()
            .map(Value::Array);
    }
    match expr
        .as_str()
        .and_then(|s| s.strip_prefix("$response.body#"))
    {
        Some(pointer) => answer.pointer(pointer).cloned(),
        None if expr.as_str().is_some_and(|s| s.starts_with('$')) => {
            panic!("link expression {expr}: extend the fuzzer")
        }
        None => Some(expr.clone()),
    }
}

/// The links of an answer, resolved: (target operationId, link object).
fn links_of(doc: &Value, op: &Operation, status: u16) -> Vec<(String, Value)> {
    let pointer = format!(
        "/paths/{}/{}/responses/{status}/links",
        escape_pointer(&op.path),
        op.method
    );
    doc.pointer(&pointer)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(_, l)| {
            let l = if l.get("$ref").is_some() {
                resolve_ref(doc, l).0.clone()
            } else {
                l.clone()
            };
            (
                l["operationId"].as_str().expect("operationId").to_owned(),
                l,
            )
        })
        .collect()
}

#[derive(Default, Debug)]
struct Tally {
    valid: usize,
    invalid: usize,
    success: usize,
    linked: usize,
    statuses: BTreeMap<u16, usize>,
}

struct Fuzzer<'a> {
    app: &'a TestApp,
    doc: Value,
    ops: Vec<Operation>,
    conformance: Conformance,
    /// Validators of every parameter and body schema, by pointer.
    validators: BTreeMap<String, jsonschema::Validator>,
    bindings: BTreeMap<String, Vec<Binding>>,
    answers: usize,
    tally: BTreeMap<String, Tally>,
}

impl Fuzzer<'_> {
    fn is_valid(&self, pointer: &str, v: &Value) -> bool {
        self.validators[pointer].is_valid(v)
    }

    /// Sends one case; checks the three properties.
    async fn run(&mut self, op_index: usize, mut case: Case) -> Result<(), TestCaseError> {
        let op = self.ops[op_index].clone();
        // Values from an earlier answer, through the document's links,
        // for every part the case did not break on purpose.
        let mut used = None;
        if let Some(ix) = case.link
            && let Some(pool) = self.bindings.get(&op.id).filter(|p| !p.is_empty())
        {
            let b = pool[ix.index(pool.len())].clone();
            for (i, p) in op.params.iter().enumerate() {
                if case.broken != Some(i)
                    && let Some(v) = b.params.get(&p.name)
                {
                    case.params[i] = Some(to_text(v));
                }
            }
            if case.broken != Some(op.params.len())
                && let Some(Value::Object(body)) = &mut case.body
            {
                for (k, v) in &b.body {
                    let v = match v.as_i64() {
                        Some(n) if case.floats && n.unsigned_abs() < EXACT => json!(n as f64),
                        _ => v.clone(),
                    };
                    let v = overlay_items(body.get(k), v);
                    body.insert(k.clone(), v);
                }
                if let Some((pointer, _)) = &op.body {
                    keep_linked_branch(&self.doc, pointer, body, &b.body);
                }
            }
            used = Some(b);
        }

        // The oracle's view: is every part valid by the document?
        let mut valid = true;
        let mut url = op.path.clone();
        let mut query = Vec::new();
        for (p, text) in op.params.iter().zip(&case.params) {
            let schema = self.doc.pointer(&p.schema).expect("schema").clone();
            match text {
                None => valid &= !p.required,
                Some(t) => {
                    valid &= self.is_valid(&p.schema, &instance(&self.doc, &schema, t));
                    match p.location {
                        Location::Path => {
                            // Not sendable: a client resolves these away.
                            if t.is_empty() || t == "." || t == ".." {
                                return Err(TestCaseError::reject("not a path segment"));
                            }
                            url = url.replace(&format!("{{{}}}", p.name), &encode_segment(t));
                        }
                        Location::Query => query.push((p.name.clone(), t.clone())),
                    }
                }
            }
        }
        if let Some((pointer, required)) = &op.body {
            valid &= match &case.body {
                Some(b) => self.is_valid(pointer, b) && beyond_the_schema(&op.id, b),
                None => !required,
            };
        }

        let mut req = self
            .app
            .http
            .request(
                op.method.to_uppercase().parse().expect("method"),
                self.app.url(&url),
            )
            .bearer_auth(&self.app.org.token)
            .query(&query);
        if let Some(b) = &case.body {
            req = req.json(b);
        }
        let r = req.send().await.expect("request");
        let status = r.status().as_u16();
        let retry_after = r.headers().contains_key("retry-after");
        let answer: Value = r.json().await.unwrap_or(Value::Null);
        let what = format!(
            "{} {url}?{query:?} body {} ({}) -> {status} {answer}",
            op.method.to_uppercase(),
            case.body
                .as_ref()
                .map_or("none".to_owned(), Value::to_string),
            if valid { "valid" } else { "invalid" }
        );

        let t = self.tally.entry(op.id.clone()).or_default();
        if valid {
            t.valid += 1;
        } else {
            t.invalid += 1;
        }
        *t.statuses.entry(status).or_default() += 1;
        if (200..300).contains(&status) {
            t.success += 1;
            if used.is_some() {
                t.linked += 1;
            }
        }
        prop_assert!(status < 500, "never a 5xx: {}", what);
        if valid {
            prop_assert!(
                status != 400,
                "a request valid by the document got 400: {}",
                what
            );
        } else {
            prop_assert!(
                !(200..300).contains(&status),
                "a request invalid by the document got {}: {}",
                status,
                what
            );
        }
        let before = self.conformance.failures.len();
        let added = self
            .conformance
            .record(&op.path, &op.method, status, retry_after, &answer);
        prop_assert!(
            added == 0,
            "the answer does not match the document: {}\n{}",
            what,
            self.conformance.failures[before..].join("\n")
        );

        if (200..300).contains(&status) {
            // A state change spends the answer its values came from.
            if op.method != "get"
                && let Some(b) = &used
            {
                for (target, pool) in self.bindings.iter_mut() {
                    let changes = self
                        .ops
                        .iter()
                        .any(|o| &o.id == target && o.method != "get");
                    if changes {
                        pool.retain(|x| x.source != b.source);
                    }
                }
            }
            self.answers += 1;
            for (target, link) in links_of(&self.doc, &op, status) {
                // A link applies to an answer only when every expression of
                // it resolves there: a reserve's answer is a Reservation or
                // an Order (R13), and each has only its own links' fields.
                let eval = |m: &Value| -> Option<Map<String, Value>> {
                    m.as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, e)| evaluate(e, &answer).map(|v| (k.clone(), v)))
                        .collect()
                };
                let (Some(params), Some(body)) =
                    (eval(&link["parameters"]), eval(&link["requestBody"]))
                else {
                    continue;
                };
                let binding = Binding {
                    source: self.answers,
                    params,
                    body,
                };
                self.bindings.entry(target).or_default().push(binding);
            }
        }
        Ok(())
    }
}

/// A body of alternatives (`oneOf` of objects, such as an extension by
/// `until` or by `seconds`) that a link filled: the generated fields of the
/// other alternatives go, so that the linked request is the branch the
/// link names (the link sets `seconds`; a generated `until` beside it
/// would make every linked request invalid).
fn keep_linked_branch(
    doc: &Value,
    pointer: &str,
    body: &mut Map<String, Value>,
    linked: &Map<String, Value>,
) {
    let Some(schema) = doc.pointer(pointer) else {
        return;
    };
    let resolved = |v: &'_ Value| -> Value {
        if v.get("$ref").is_some() {
            resolve_ref(doc, v).0.clone()
        } else {
            v.clone()
        }
    };
    let Some(Value::Array(branches)) = resolved(schema).get("oneOf").cloned() else {
        return;
    };
    let branches: Vec<Value> = branches.iter().map(resolved).collect();
    let branch = branches.iter().find(|b| {
        b["properties"]
            .as_object()
            .is_some_and(|p| linked.keys().all(|k| p.contains_key(k)))
    });
    if let Some(props) = branch.and_then(|b| b["properties"].as_object()) {
        body.retain(|k, _| props.contains_key(k));
    }
}

/// A link that names a list of objects (an order's reservations) gives the
/// values of the fields the generated items have (their id and fence), one
/// item per linked object; every other field of an item (a service_ref)
/// stays generated. Anything else is the linked value as it is.
fn overlay_items(generated: Option<&Value>, linked: Value) -> Value {
    let (Some(Value::Array(made)), Value::Array(from)) = (generated, &linked) else {
        return linked;
    };
    if made.is_empty() || !from.iter().all(Value::is_object) {
        return linked;
    }
    Value::Array(
        from.iter()
            .zip(made.iter().cycle())
            .map(|(l, g)| match g {
                Value::Object(g) => Value::Object(
                    g.iter()
                        .map(|(k, v)| (k.clone(), l.get(k).cloned().unwrap_or_else(|| v.clone())))
                        .collect(),
                ),
                other => other.clone(),
            })
            .collect(),
    )
}

/// The documented examples of a body schema's properties, as one object.
fn example_body(doc: &Value, pointer: &str) -> Value {
    let mut schema = doc.pointer(pointer).expect("schema");
    if schema.get("$ref").is_some() {
        schema = resolve_ref(doc, schema).0;
    }
    Value::Object(
        schema["properties"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, s)| Some((k.clone(), s["examples"].get(0)?.clone())))
            .collect(),
    )
}

/// Cases per operation per round; three rounds interleave the operations so
/// that later calls find objects made by earlier ones.
const CASES: u32 = 10;
const ROUNDS: usize = 3;
/// The generators' seed: each runner's is this plus its round and
/// operation, so the suite is deterministic and a failure replays as it ran.
const SEED: u64 = 1_000;

#[test]
fn generated_requests_agree_with_the_published_document() {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Webhook URLs of the examples resolve nowhere here: the deployment
    // setting lets the fuzzer register a loopback one (see below).
    let app = rt.block_on(crate::helpers::spawn_app_with(|s| {
        s.webhook_allow_private = true;
    }));
    let conformance = rt.block_on(Conformance::new(&app));
    let doc = conformance.doc.clone();
    let ops = operations(&doc);
    assert!(
        ops.len() >= 10,
        "every operation of docs/api.md: {}",
        ops.len()
    );
    let mut validators = BTreeMap::new();
    for op in &ops {
        for p in op
            .params
            .iter()
            .map(|p| p.schema.clone())
            .chain(op.body.iter().map(|b| b.0.clone()))
        {
            validators
                .entry(p.clone())
                .or_insert_with(|| validator_at(&doc, &p));
        }
    }
    let mut fuzzer = Fuzzer {
        app: &app,
        doc: doc.clone(),
        ops: ops.clone(),
        conformance,
        validators,
        bindings: BTreeMap::new(),
        answers: 0,
        tally: BTreeMap::new(),
    };

    // Machines that match the reserve body's examples, made through the
    // API (their answers feed the links too).
    let put = ops
        .iter()
        .position(|o| o.id == "putMachine")
        .expect("putMachine");
    let reserve = ops.iter().position(|o| o.id == "reserve").expect("reserve");
    let machine = example_body(&doc, &ops[put].body.as_ref().expect("body").0);
    let order = example_body(&doc, &ops[reserve].body.as_ref().expect("body").0);
    rt.block_on(async {
        for i in 0..48 {
            let c = Case {
                params: vec![Some(format!("CT-{i:03}"))],
                body: Some(machine.clone()),
                broken: None,
                link: None,
                floats: false,
            };
            fuzzer.run(put, c).await.expect("a machine");
        }
        // Held reservations, so that convert, cancel and extend (which
        // take them in turn) find some.
        for i in 0..12 {
            let mut body = order.clone();
            body["order_ref"] = json!(format!("ORD-CT-{i}"));
            let c = Case {
                params: vec![],
                body: Some(body),
                broken: None,
                link: None,
                floats: false,
            };
            fuzzer.run(reserve, c).await.expect("a reservation");
        }
        // And orders of two (R13), so that each of the three order
        // operations (which take them in turn) finds some through links.
        for i in 0..16 {
            let mut body = order.clone();
            body["order_ref"] = json!(format!("ORD-CT-PAIR-{i}"));
            body["quantity"] = json!(2);
            let c = Case {
                params: vec![],
                body: Some(body),
                broken: None,
                link: None,
                floats: false,
            };
            fuzzer.run(reserve, c).await.expect("an order of two");
        }
        // A webhook, so that reading it answers 200 before a generated
        // DELETE removes it.
        let put_hook = ops
            .iter()
            .position(|o| o.id == "putWebhook")
            .expect("putWebhook");
        let c = Case {
            params: vec![],
            body: Some(json!({"url": "http://127.0.0.1:8081/hooks/poolkeeper"})),
            broken: None,
            link: None,
            floats: false,
        };
        fuzzer.run(put_hook, c).await.expect("a webhook");
        // A headroom (R18), so that listing it has a row and capacity's
        // `reserved` names a segment.
        let put_headroom = ops
            .iter()
            .position(|o| o.id == "putHeadroom")
            .expect("putHeadroom");
        let c = Case {
            params: vec![],
            body: Some(
                json!({"site": machine["site"], "profile": machine["profile"],
                              "segment": "enterprise", "machines": 1}),
            ),
            broken: None,
            link: None,
            floats: false,
        };
        fuzzer.run(put_headroom, c).await.expect("a headroom");
    });

    let strategies: Vec<BoxedStrategy<Case>> = ops.iter().map(|op| case(&doc, op)).collect();
    for round in 0..ROUNDS {
        for (i, op) in ops.iter().enumerate() {
            let mut runner = TestRunner::new(Config {
                cases: CASES,
                failure_persistence: None,
                max_shrink_iters: 32,
                rng_seed: RngSeed::Fixed(SEED + (round * ops.len() + i) as u64),
                ..Config::default()
            });
            let fuzzer = std::cell::RefCell::new(&mut fuzzer);
            runner
                .run(&strategies[i], |c| {
                    rt.block_on(fuzzer.borrow_mut().run(i, c))
                })
                .unwrap_or_else(|e| panic!("round {round}, {} {}: {e}", op.method, op.path));
        }
    }

    // Both sides of the property, and the 2xx of every operation, were
    // exercised: a generator that only makes junk proves nothing. (An
    // operation with no parameter and no body has no invalid request.)
    let summary = format!("{:#?}", fuzzer.tally);
    for op in &ops {
        let t = fuzzer.tally.get(&op.id);
        let (v, inv, ok) = t.map_or((0, 0, 0), |t| (t.valid, t.invalid, t.success));
        let has_input = !op.params.is_empty() || op.body.is_some();
        assert!(
            v > 0 && (inv > 0 || !has_input) && ok > 0,
            "{}: {v} valid, {inv} invalid, {ok} 2xx\n{summary}",
            op.id
        );
    }
    let linked: usize = fuzzer.tally.values().map(|t| t.linked).sum();
    assert!(linked > 0, "links were followed to a 2xx\n{summary}");
    let total: usize = fuzzer.tally.values().map(|t| t.valid + t.invalid).sum();
    eprintln!(
        "contract fuzzer: {total} requests over {} operations in {:?}\n{summary}",
        ops.len(),
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------
// Links
// ---------------------------------------------------------------------------

/// The schema a `$response.body#/a/b` pointer lands on, walking
/// `properties` through `$ref`, `anyOf` and `oneOf`.
fn schema_at(doc: &Value, schema: &Value, pointer: &str) -> Option<Value> {
    let mut here = schema.clone();
    for key in pointer.split('/').skip(1) {
        here = property(doc, &here, key)?;
    }
    Some(here)
}

fn property(doc: &Value, schema: &Value, key: &str) -> Option<Value> {
    if schema.get("$ref").is_some() {
        return property(doc, resolve_ref(doc, schema).0, key);
    }
    if let Some(p) = schema["properties"].get(key) {
        return Some(p.clone());
    }
    schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)?
        .iter()
        .find_map(|b| property(doc, b, key))
}

/// Whether a schema (through `$ref`) is or admits an integer.
fn is_integer(doc: &Value, schema: &Value) -> bool {
    admits_integer(doc, schema)
}

/// A validator of a schema that may `$ref` into the document.
fn validator_of(doc: &Value, schema: &Value) -> jsonschema::Validator {
    let mut root = doc.clone();
    for (k, v) in schema.as_object().expect("a schema object") {
        root[k] = v.clone();
    }
    jsonschema::validator_for(&root).expect("compiles")
}

#[tokio::test]
async fn document_links_resolve_to_operations_parameters_and_answer_fields() {
    let app = spawn_app().await;
    let doc = Conformance::new(&app).await.doc;
    let ops = operations(&doc);
    let mut seen = Vec::new();
    for op in &ops {
        let responses = doc
            .pointer(&format!(
                "/paths/{}/{}/responses",
                escape_pointer(&op.path),
                op.method
            ))
            .and_then(Value::as_object)
            .expect("responses");
        for status in responses.keys() {
            let status: u16 = status.parse().expect("a numeric status");
            let schema = doc
                .pointer(&format!(
                    "/paths/{}/{}/responses/{status}/content/application~1json/schema",
                    escape_pointer(&op.path),
                    op.method
                ))
                .cloned()
                .unwrap_or(Value::Null);
            for (target, link) in links_of(&doc, op, status) {
                let what = format!("{} {status} -> {target}", op.id);
                let t = ops
                    .iter()
                    .find(|o| o.id == target)
                    .unwrap_or_else(|| panic!("{what}: no operation {target}"));
                let evaluated = |expr: &Value, target_schema: &Value, name: &str| {
                    if let Some(pointer) = expr
                        .as_str()
                        .and_then(|s| s.strip_prefix("$response.body#"))
                    {
                        let field = schema_at(&doc, &schema, pointer)
                            .unwrap_or_else(|| panic!("{what}: the answer has no {pointer}"));
                        // An id or a fence feeds an integer, a string a string.
                        assert_eq!(
                            is_integer(&doc, &field),
                            is_integer(&doc, target_schema),
                            "{what}: {name} from {pointer} has the target's type"
                        );
                    } else {
                        assert!(
                            !expr.as_str().is_some_and(|s| s.starts_with('$')),
                            "{what}: {expr} is not an expression this test knows"
                        );
                        // A literal must be a valid value of its field.
                        assert!(
                            validator_of(&doc, target_schema).is_valid(expr),
                            "{what}: {name} = {expr} is valid for the target"
                        );
                    }
                };
                for (name, expr) in link["parameters"].as_object().expect("parameters") {
                    let p = t
                        .params
                        .iter()
                        .find(|p| &p.name == name)
                        .unwrap_or_else(|| panic!("{what}: {target} has no parameter {name}"));
                    let target_schema = doc.pointer(&p.schema).expect("schema").clone();
                    evaluated(expr, &target_schema, name);
                }
                let required_params = t.params.iter().filter(|p| p.location == Location::Path);
                for p in required_params {
                    assert!(
                        link["parameters"].get(&p.name).is_some(),
                        "{what}: the link gives the path parameter {}",
                        p.name
                    );
                }
                if let Some(body) = link.get("requestBody") {
                    let (pointer, _) = t
                        .body
                        .as_ref()
                        .unwrap_or_else(|| panic!("{what}: {target} takes no body"));
                    let body_schema = doc.pointer(pointer).expect("body schema").clone();
                    for (name, expr) in body.as_object().expect("a body object") {
                        let field = property(&doc, &body_schema, name)
                            .unwrap_or_else(|| panic!("{what}: the body has no field {name}"));
                        match expr {
                            // An array of expressions feeds an array field,
                            // item by item.
                            Value::Array(items)
                                if items
                                    .iter()
                                    .any(|i| i.as_str().is_some_and(|s| s.starts_with('$'))) =>
                            {
                                let item_schema = field
                                    .get("items")
                                    .cloned()
                                    .unwrap_or_else(|| panic!("{what}: {name} is not an array"));
                                for item in items {
                                    evaluated(item, &item_schema, name);
                                }
                            }
                            _ => evaluated(expr, &field, name),
                        }
                    }
                }
                seen.push((op.id.clone(), target));
            }
        }
    }
    // The order flow of docs/api.md: reserve -> read -> convert or cancel, with
    // the fence of the answer; convert -> end the service.
    for (from, to) in [
        ("reserve", "getReservation"),
        ("reserve", "convert"),
        ("reserve", "cancel"),
        ("findReservation", "convert"),
        ("convert", "endService"),
    ] {
        assert!(
            seen.iter().any(|(f, t)| f == from && t == to),
            "a link {from} -> {to}: {seen:?}"
        );
    }
    for target in ["convert", "cancel"] {
        let link = doc["components"]["links"]
            .as_object()
            .expect("links")
            .values()
            .find(|l| l["operationId"] == target)
            .expect("a link");
        assert_eq!(link["requestBody"]["fence"], "$response.body#/fence");
    }
}

/// Following the links of one real answer walks the whole order flow.
#[tokio::test]
async fn following_the_links_of_a_reservation_walks_the_order_flow() {
    let app = spawn_app().await;
    let doc = Conformance::new(&app).await.doc;
    let ops = operations(&doc);
    for tag in ["LK-1", "LK-2"] {
        let r = app
            .put_machine(
                &app.org.token,
                tag,
                "par1",
                "dell",
                "epyc-9354-256g",
                "ready",
            )
            .await;
        assert_eq!(r.status(), 201);
    }
    let op = |id: &str| ops.iter().find(|o| o.id == id).expect("operation").clone();
    // Calls `target` with the values a link evaluates from `answer`.
    let follow = |link: Value, answer: Value, target: Operation| {
        let app = &app;
        async move {
            let mut url = target.path.clone();
            let mut query = Vec::new();
            for (name, expr) in link["parameters"].as_object().expect("parameters") {
                let v = to_text(&evaluate(expr, &answer).expect("the answer has it"));
                match target
                    .params
                    .iter()
                    .find(|p| &p.name == name)
                    .map(|p| p.location)
                {
                    Some(Location::Path) => url = url.replace(&format!("{{{name}}}"), &v),
                    _ => query.push((name.clone(), v)),
                }
            }
            let mut req = app
                .http
                .request(
                    target.method.to_uppercase().parse().expect("method"),
                    app.url(&url),
                )
                .bearer_auth(&app.org.token)
                .query(&query);
            if let Some(body) = link["requestBody"].as_object() {
                let body: Map<String, Value> = body
                    .iter()
                    .map(|(k, e)| (k.clone(), evaluate(e, &answer).expect("the answer has it")))
                    .collect();
                req = req.json(&body);
            }
            let r = req.send().await.expect("request");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("json"))
        }
    };
    let reserve = |order: &'static str| {
        app.http
            .post(app.url("/api/v1/reservations"))
            .bearer_auth(&app.org.token)
            .json(&json!({"order_ref": order, "site": "par1", "profile": "epyc-9354-256g"}))
            .send()
    };
    let first: Value = reserve("ORD-LINK-1")
        .await
        .expect("reserve")
        .json()
        .await
        .expect("json");
    let second: Value = reserve("ORD-LINK-2")
        .await
        .expect("reserve")
        .json()
        .await
        .expect("json");
    let links: BTreeMap<String, Value> = links_of(&doc, &op("reserve"), 201).into_iter().collect();
    for read in ["getReservation", "reservationEvents", "findReservation"] {
        let (status, body) = follow(links[read].clone(), first.clone(), op(read)).await;
        assert_eq!(status, 200, "{read}: {body}");
    }
    let (status, converted) = follow(links["convert"].clone(), first.clone(), op("convert")).await;
    assert_eq!(status, 200, "convert: {converted}");
    assert_eq!(converted["state"], "converted");
    let (status, cancelled) = follow(links["cancel"].clone(), second.clone(), op("cancel")).await;
    assert_eq!(status, 200, "cancel: {cancelled}");
    assert_eq!(cancelled["state"], "cancelled");
    let after_convert: BTreeMap<String, Value> =
        links_of(&doc, &op("convert"), 200).into_iter().collect();
    let (status, ended) = follow(
        after_convert["endService"].clone(),
        converted,
        op("endService"),
    )
    .await;
    assert_eq!(status, 200, "end: {ended}");
    assert!(ended["ended_at"].is_string(), "{ended}");
}

// ---------------------------------------------------------------------------
// Four disagreements the fuzzer found, as explicit regressions
// ---------------------------------------------------------------------------

#[tokio::test]
async fn integral_numbers_in_float_form_and_empty_filters_agree_with_the_document() {
    let app = spawn_app().await;
    let doc = Conformance::new(&app).await.doc;
    for tag in ["RG-1", "RG-2", "RG-3"] {
        app.put_machine(&app.org.token, tag, "par1", "dell", "epyc", "ready")
            .await;
    }
    let post = |path: String, body: Value| {
        app.http
            .post(app.url(&format!("/api/v1{path}")))
            .bearer_auth(&app.org.token)
            .json(&body)
            .send()
    };
    let reserve_schema = validator_at(&doc, "/components/schemas/ReserveBody");
    let body =
        json!({"order_ref": "ORD-F1", "site": "par1", "profile": "epyc", "hold_seconds": 3121.0});
    assert!(
        reserve_schema.is_valid(&body),
        "the document accepts 3121.0"
    );
    let r = post("/reservations".into(), body).await.expect("reserve");
    assert_eq!(r.status(), 201);
    let held: Value = r.json().await.expect("json");
    assert_eq!(held["hold_seconds"], 3121);

    let body =
        json!({"order_ref": "ORD-F2", "site": "par1", "profile": "epyc", "hold_seconds": 40121.5});
    assert!(
        !reserve_schema.is_valid(&body),
        "the document refuses 40121.5"
    );
    let r = post("/reservations".into(), body).await.expect("reserve");
    assert_eq!(r.status(), 400);
    let refused: Value = r.json().await.expect("json");
    assert_eq!(refused["error"], "invalid");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("hold_seconds") && message.contains("whole number"),
        "{message}"
    );

    let (id, fence) = (
        held["id"].as_i64().expect("id"),
        held["fence"].as_i64().expect("fence"),
    );
    let r = post(
        format!("/reservations/{id}/cancel"),
        json!({"fence": fence as f64 + 0.5, "reason": "gave up"}),
    )
    .await
    .expect("cancel");
    assert_eq!(r.status(), 400);
    let message = r.json::<Value>().await.expect("json")["message"].to_string();
    assert!(message.contains("fence"), "{message}");
    let r = post(
        format!("/reservations/{id}/cancel"),
        json!({"fence": fence as f64, "reason": "gave up"}),
    )
    .await
    .expect("cancel");
    assert_eq!(r.status(), 200);
    let r = post(
        "/reservations".into(),
        json!({"order_ref": "ORD-F3", "site": "par1", "profile": "epyc"}),
    )
    .await
    .expect("reserve");
    let third: Value = r.json().await.expect("json");
    let r = post(
        format!("/reservations/{}/convert", third["id"]),
        json!({"fence": third["fence"].as_i64().expect("fence") as f64, "service_ref": "SRV-1"}),
    )
    .await
    .expect("convert");
    assert_eq!(r.status(), 200);

    // An empty filter is no filter, on both sides.
    let vendor = doc
        .pointer("/paths/~1api~1v1~1machines/get/parameters")
        .and_then(Value::as_array)
        .and_then(|ps| ps.iter().position(|p| p["name"] == "vendor"))
        .expect("a vendor parameter");
    let v = validator_at(
        &doc,
        &format!("/paths/~1api~1v1~1machines/get/parameters/{vendor}/schema"),
    );
    assert!(v.is_valid(&json!("")), "the document allows vendor=");
    let r = app
        .http
        .get(app.url("/api/v1/machines?vendor=&site=&profile=&status=&after="))
        .bearer_auth(&app.org.token)
        .send()
        .await
        .expect("list");
    assert_eq!(r.status(), 200);
    let all: Value = r.json().await.expect("json");
    assert_eq!(all["machines"].as_array().map(Vec::len), Some(3));
}
