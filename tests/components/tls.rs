//! TLS to PostgreSQL: a cluster of its own, listening on
//! 127.0.0.1 with `ssl = on` and a certificate signed by a CA made here.

use std::path::Path;
use std::time::{Duration, Instant};

use poolkeeper::embedded_pg::{ClusterOptions, EmbeddedPostgres, ServerExtras, TlsFiles};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use sqlx::{ConnectOptions, Connection};

use crate::helpers::replicas::{Replica, free_port};

/// A CA (certificate PEM, issuer) named `name`.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed CA");
    (cert.pem(), Issuer::new(params, key))
}

/// Writes ca.pem, wrong-ca.pem, server.crt and server.key into `dir`.
fn make_certificates(dir: &Path) {
    let (ca_pem, issuer) = ca("poolkeeper test CA");
    let (wrong_pem, _) = ca("some other CA");
    let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("server params");
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let key = KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &issuer).expect("server certificate");
    std::fs::write(dir.join("ca.pem"), ca_pem).expect("write");
    std::fs::write(dir.join("wrong-ca.pem"), wrong_pem).expect("write");
    std::fs::write(dir.join("server.crt"), cert.pem()).expect("write");
    std::fs::write(dir.join("server.key"), key.serialize_pem()).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_connects_with_verify_full_and_refuses_a_wrong_ca_at_once() {
    let dir = std::env::temp_dir().join(format!(
        "poolkeeper-tls-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    poolkeeper::embedded_pg::prepare_private_dir(&dir).expect("dir");
    make_certificates(&dir);
    let port = free_port();
    let opts = ClusterOptions {
        data_dir: dir.join("pg"),
        log_file: dir.join("postgres.log"),
        throwaway: true,
    };
    let extras = ServerExtras {
        tcp_port: Some(port),
        tls: Some(TlsFiles {
            cert_file: dir.join("server.crt"),
            key_file: dir.join("server.key"),
        }),
    };
    let pg = tokio::task::spawn_blocking(move || EmbeddedPostgres::start_with(&opts, &extras))
        .await
        .expect("join")
        .expect("start a TLS cluster");
    let mut admin = pg
        .connect_options("postgres")
        .connect()
        .await
        .expect("admin over the socket");
    sqlx::raw_sql("CREATE DATABASE poolkeeper")
        .execute(&mut admin)
        .await
        .expect("create db");

    let url = |ca: &str| {
        format!(
            "postgres://postgres@localhost:{port}/poolkeeper?sslmode=verify-full&sslrootcert={}",
            dir.join(ca).display()
        )
    };
    // The right CA: serve migrates and answers, and its sessions are TLS.
    let replica = Replica::start("tls-ok", &[("DATABASE_URL", url("ca.pem"))]).await;
    let ready = reqwest::get(replica.url("/readyz")).await.expect("readyz");
    assert_eq!(ready.status().as_u16(), 200, "{}", replica.log());
    let (tls_sessions, plain_sessions): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
           FROM pg_stat_activity a JOIN pg_stat_ssl s ON s.pid = a.pid
          WHERE a.application_name LIKE 'poolkeeper%' AND a.datname = 'poolkeeper'",
    )
    .fetch_one(&mut admin)
    .await
    .expect("pg_stat_ssl");
    assert!(tls_sessions >= 1, "no TLS session");
    assert_eq!(plain_sessions, 0);
    drop(replica);

    // A wrong CA: refused at start-up with a clear error, not a hang.
    let started = Instant::now();
    let mut wrong = Replica::spawn(
        "tls-wrong",
        free_port(),
        &[("DATABASE_URL", url("wrong-ca.pem"))],
    );
    let (status, log) = wrong.exit(Duration::from_secs(30)).await;
    let took = started.elapsed();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("connecting to the database (TLS: sslrootcert"),
        "{log}"
    );
    assert!(
        log.contains("certificate") || log.contains("UnknownIssuer"),
        "the error names the certificate problem: {log}"
    );
    assert!(
        took < Duration::from_secs(20),
        "refused after {took:?}: {log}"
    );
    let _ = admin.close().await;
    tokio::task::spawn_blocking(move || pg.stop())
        .await
        .expect("stop");
    let _ = std::fs::remove_dir_all(&dir);
}
