//! A webhook receiver on 127.0.0.1 (actix-web): records every request and
//! answers 500 on demand. Used by the webhook tests and the failover run.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::Value;

#[derive(Clone, Debug)]
pub(crate) struct Received {
    pub(crate) event_id: i64,
    pub(crate) timestamp: String,
    pub(crate) signature: String,
    pub(crate) attempt: u32,
    pub(crate) body: Vec<u8>,
    /// The status this receiver answered.
    pub(crate) answered: u16,
}

impl Received {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

#[derive(Clone, Default)]
pub(crate) struct Receiver {
    log: Arc<Mutex<Vec<Received>>>,
    /// Answer 500 to this many requests, then 200.
    pub(crate) fail_next: Arc<AtomicUsize>,
    /// Wait this long before answering (to have requests in flight).
    pub(crate) delay_ms: Arc<AtomicU64>,
    pub(crate) port: u16,
}

impl Receiver {
    pub(crate) async fn start() -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the receiver");
        let r = Receiver {
            port: listener.local_addr().expect("address").port(),
            ..Receiver::default()
        };
        let state = r.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(web::Data::new(state.clone()))
                .app_data(web::PayloadConfig::new(1 << 20))
                .default_service(web::to(receive))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .expect("listen")
        .run();
        tokio::spawn(server);
        r
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/poolkeeper", self.port)
    }

    pub(crate) fn requests(&self) -> Vec<Received> {
        self.log.lock().expect("log").clone()
    }

    /// Event ids answered 200.
    pub(crate) fn delivered(&self) -> BTreeSet<i64> {
        self.requests()
            .iter()
            .filter(|r| r.answered == 200)
            .map(|r| r.event_id)
            .collect()
    }
}

async fn receive(req: HttpRequest, body: web::Bytes, r: web::Data<Receiver>) -> HttpResponse {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let delay = r.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let fail = r
        .fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    let answered = if fail { 500 } else { 200 };
    r.log.lock().expect("log").push(Received {
        event_id: header("poolkeeper-event-id").parse().unwrap_or(-1),
        timestamp: header("poolkeeper-timestamp"),
        signature: header("poolkeeper-signature"),
        attempt: header("poolkeeper-delivery-attempt").parse().unwrap_or(0),
        body: body.to_vec(),
        answered,
    });
    if fail {
        HttpResponse::InternalServerError().body("on demand")
    } else {
        HttpResponse::Ok().body("ok")
    }
}
