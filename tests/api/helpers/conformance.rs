//! Checks served answers against the OpenAPI document: used by the
//! document's tests, the contract fuzzer, the write tests and the failover
//! run.

use serde_json::Value;

/// Validates a served answer against the document: the status must be
/// documented for the operation, the body must match the status's schema.
pub(crate) struct Conformance {
    pub(crate) doc: Value,
    pub(crate) failures: Vec<String>,
    pub(crate) checked: std::collections::BTreeSet<(String, String, u16)>,
    validators: std::collections::HashMap<String, jsonschema::Validator>,
}

pub(crate) fn escape_pointer(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// A validator of the schema at `pointer` (from the document's root), with
/// the whole document around it so that its `$ref`s resolve.
pub(crate) fn validator_at(doc: &Value, pointer: &str) -> jsonschema::Validator {
    let mut schema = doc.clone();
    // A URI fragment: the braces of path templates are percent-encoded.
    let fragment = pointer.replace('{', "%7B").replace('}', "%7D");
    schema["$ref"] = Value::from(format!("#{fragment}"));
    jsonschema::validator_for(&schema).expect("the document compiles")
}

impl Conformance {
    pub(crate) async fn new(app: &crate::helpers::TestApp) -> Conformance {
        let doc: Value = app
            .http
            .get(app.url("/api/openapi.json"))
            .send()
            .await
            .expect("request")
            .json()
            .await
            .expect("json");
        Conformance {
            doc,
            failures: Vec::new(),
            checked: Default::default(),
            validators: Default::default(),
        }
    }

    /// JSON pointer (from the document's root) of the schema of `status`.
    fn schema_pointer(&self, path: &str, method: &str, status: u16) -> Option<String> {
        let mut pointer = format!(
            "/paths/{}/{method}/responses/{status}",
            escape_pointer(path)
        );
        let response = self.doc.pointer(&pointer)?;
        if let Some(r) = response.get("$ref").and_then(Value::as_str) {
            pointer = r.trim_start_matches('#').to_owned();
        }
        let schema = format!("{pointer}/content/application~1json/schema");
        self.doc.pointer(&schema).map(|_| schema)
    }

    pub(crate) async fn check(
        &mut self,
        path: &str,
        method: &str,
        resp: reqwest::Response,
    ) -> Value {
        let status = resp.status().as_u16();
        let retry_after = resp.headers().contains_key("retry-after");
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        self.record(path, method, status, retry_after, &body);
        body
    }

    /// Checks an answer already read; returns how many mismatches it added.
    pub(crate) fn record(
        &mut self,
        path: &str,
        method: &str,
        status: u16,
        retry_after: bool,
        body: &Value,
    ) -> usize {
        let before = self.failures.len();
        self.checked
            .insert((method.to_owned(), path.to_owned(), status));
        let what = format!("{method} {path} {status}");
        // A documented answer without content (304) has no body.
        let bodiless = self
            .doc
            .pointer(&format!(
                "/paths/{}/{method}/responses/{status}",
                escape_pointer(path)
            ))
            .is_some_and(|r| r.get("$ref").is_none() && r.get("content").is_none());
        if bodiless {
            if !body.is_null() {
                self.failures
                    .push(format!("{what}: documented without a body, got {body}"));
            }
            return self.failures.len() - before;
        }
        let Some(pointer) = self.schema_pointer(path, method, status) else {
            self.failures
                .push(format!("{what}: status not documented (body {body})"));
            return self.failures.len() - before;
        };
        let validator = self
            .validators
            .entry(pointer.clone())
            .or_insert_with(|| validator_at(&self.doc, &pointer));
        for e in validator.iter_errors(body) {
            self.failures.push(format!(
                "{what}: {e} at {} (body {body})",
                e.instance_path()
            ));
        }
        let needs_retry = status == 503 || body["error"] == "contended";
        if needs_retry != retry_after {
            self.failures.push(format!(
                "{what}: Retry-After {retry_after}, expected {needs_retry}"
            ));
        }
        self.failures.len() - before
    }
}
