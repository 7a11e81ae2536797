//! The organization's webhook (scope `orders`): the order service
//! registers where reservation events go. `orders`, not a scope of its own:
//! the events are the orders' own (the same token already reads every
//! reservation and its events), and the order service is the party that
//! both places orders and receives their events.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use crate::api::caller::ApiClient;
use crate::api::reservations::{json_body, read_body};
use crate::api::write::{Shape, write};
use crate::domain::Scope;
use crate::error::{ApiError, not_found};
use crate::settings::Settings;
use crate::webhooks::{self, Saved};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/webhook")
            .route(web::get().to(get))
            .route(web::put().to(put))
            .route(web::delete().to(delete)),
    );
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookBody {
    url: String,
    #[serde(default)]
    rotate_secret: bool,
}

async fn get(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Orders)?;
    let hook = webhooks::get(pool.get_ref(), client.org_id)
        .await?
        .ok_or(not_found("webhook"))?;
    Ok(HttpResponse::Ok().json(hook))
}

async fn put(
    req: HttpRequest,
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Orders)?;
    let b: WebhookBody = json_body(&read_body(payload).await?)?;
    // A body of the documented shape whose URL is refused is 422, not 400:
    // whether a URL is acceptable (it parses, its host is not internal)
    // is more than the document's schema can say.
    let refused = |e: webhooks::UrlError| ApiError::Unprocessable {
        code: "url_refused",
        message: e.to_string(),
    };
    let url = webhooks::parse_url(&b.url).map_err(refused)?;
    webhooks::check_destination(&url, settings.webhook_allow_private)
        .await
        .map_err(refused)?;
    let (hook, saved) = write(&pool, Shape::Transaction, async |tx| {
        let saved = webhooks::set_on(
            tx,
            client.org_id,
            url.as_str(),
            b.rotate_secret,
            &client.token_name,
        )
        .await?;
        record(
            tx,
            &req,
            &client,
            "org.webhook_set",
            &if b.rotate_secret {
                format!("{url} (secret rotated)")
            } else {
                url.to_string()
            },
        )
        .await?;
        Ok(saved)
    })
    .await?;
    Ok(match saved {
        Saved::Created => HttpResponse::Created().json(hook),
        Saved::Updated => HttpResponse::Ok().json(hook),
    })
}

async fn delete(
    req: HttpRequest,
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Orders)?;
    let dropped = write(&pool, Shape::Transaction, async |tx| {
        let Some(dropped) = webhooks::remove_on(tx, client.org_id).await? else {
            return Ok(None);
        };
        record(
            tx,
            &req,
            &client,
            "org.webhook_removed",
            &format!("{dropped} pending deliveries dropped"),
        )
        .await?;
        Ok(Some(dropped))
    })
    .await?
    .ok_or(not_found("webhook"))?;
    Ok(HttpResponse::Ok().json(json!({"removed": true, "dropped_deliveries": dropped})))
}

/// The audit row of an API change, in the change's transaction: the actor
/// is the token's name, as on reservations.
async fn record(
    conn: &mut sqlx::PgConnection,
    req: &HttpRequest,
    client: &ApiClient,
    action: &str,
    detail: &str,
) -> Result<(), sqlx::Error> {
    crate::audit::record(
        conn,
        &crate::audit::Entry {
            org_id: Some(client.org_id),
            actor: &format!("token:{}", client.token_name),
            action,
            object: &format!("org:{}", client.org_id),
            source_addr: &crate::dashboard::session::source_addr(req),
            detail: Some(detail),
        },
    )
    .await
}
