//! The orders API as a test calls it, and waiting on a condition.

use std::future::Future;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use super::TestApp;

impl TestApp {
    /// POST `body` to `path` with `token`: the status and the JSON answer
    /// (`Null` when the answer is not JSON).
    pub async fn post_as(&self, token: &str, path: &str, body: &Value) -> (StatusCode, Value) {
        let r = self
            .http
            .post(self.url(path))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// POST /api/v1/reservations with `token`.
    pub async fn reserve(&self, token: &str, body: Value) -> (StatusCode, Value) {
        self.post_as(token, "/api/v1/reservations", &body).await
    }

    /// POST /api/v1/reservations with `token`, which must create the
    /// order (201): its body.
    pub async fn reserve_created(&self, token: &str, body: Value) -> Value {
        let (status, answer) = self.reserve(token, body.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "reserve {body}: {answer}");
        answer
    }

    /// POST /api/v1/reservations/{id}/cancel with `token`.
    pub async fn cancel(&self, token: &str, id: i64, body: Value) -> (StatusCode, Value) {
        self.post_as(token, &format!("/api/v1/reservations/{id}/cancel"), &body)
            .await
    }

    /// POST /api/v1/reservations/{id}/convert with `token`.
    pub async fn convert(&self, token: &str, id: i64, body: Value) -> (StatusCode, Value) {
        self.post_as(token, &format!("/api/v1/reservations/{id}/convert"), &body)
            .await
    }

    /// Cancels reservation `id` with `token`, which must succeed (200): the
    /// answer's body.
    pub async fn cancel_ok(&self, token: &str, id: i64, body: Value) -> Value {
        let (status, answer) = self.cancel(token, id, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "cancel {id} {body}: {answer}");
        answer
    }

    /// Converts reservation `id` with `token`, which must succeed (200):
    /// the answer's body.
    pub async fn convert_ok(&self, token: &str, id: i64, body: Value) -> Value {
        let (status, answer) = self.convert(token, id, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "convert {id} {body}: {answer}");
        answer
    }

    /// Checks `check` until it holds; fails the test naming `what` when it
    /// still does not after `within`. For what a test cannot await
    /// directly: another process, or a worker's next round.
    pub async fn wait_for<F, Fut>(&self, what: &str, within: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + within;
        let mut pause = Duration::from_millis(10);
        loop {
            if check().await {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {within:?} waiting for {what}"
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}
