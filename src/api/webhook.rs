//! The organization's webhook (scope `orders`): the order service
//! registers where reservation events go. `orders`, not a scope of its own:
//! the events are the orders' own (the same token already reads every
//! reservation and its events), and the order service is the party that
//! both places orders and receives their events.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::caller::ApiClient;
use crate::api::reservations::{json_body, read_body};
use crate::api::schemas::{
    Forbidden, Invalid, NotFound, Unauthorized, Unavailable, UrlRefusedError, WriteUnavailable,
};
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

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WebhookBody {
    /// http:// or https://; a loopback or private address (the second example) only where the deployment sets POOLKEEPER_WEBHOOK_ALLOW_PRIVATE
    #[schema(
        max_length = 2048,
        format = "uri",
        examples(
            "https://orders.example.com/hooks/poolkeeper",
            "http://127.0.0.1:8081/hooks/poolkeeper"
        )
    )]
    url: String,
    /// make a new signing secret
    #[serde(default)]
    #[schema(default = false)]
    rotate_secret: bool,
}

// The answer of removing the webhook.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookRemoved {
    #[schema(schema_with = crate::api::schemas::const_true)]
    removed: bool,
    #[schema(minimum = 0)]
    dropped_deliveries: i64,
}

#[utoipa::path(
    get,
    path = "/api/v1/webhook",
    operation_id = "getWebhook",
    summary = "The organization's webhook, with its signing secret (scope orders)",
    responses(
        (status = 200, description = "the webhook", body = webhooks::Webhook),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    )
)]
pub(crate) async fn get(
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

#[utoipa::path(
    put,
    path = "/api/v1/webhook",
    operation_id = "putWebhook",
    summary = "Set or change the organization's webhook URL (scope orders)",
    description = "A new webhook gets a server-generated signing secret; changing the URL keeps the secret unless rotate_secret is true. The URL must be http or https, without credentials; a host that is or resolves to a loopback, private, link-local or unspecified address is refused (422 url_refused) unless the deployment sets POOLKEEPER_WEBHOOK_ALLOW_PRIVATE. Pending deliveries go to the new URL. Every event of the organization's reservations is then POSTed there: see webhooks.reservationEvent.",
    request_body = WebhookBody,
    responses(
        (status = 200, description = "changed", body = webhooks::Webhook),
        (status = 201, description = "created, with a new secret", body = webhooks::Webhook),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 422, description = "the URL is refused (error url_refused); nothing written", body = UrlRefusedError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn put(
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
            crate::audit::AuditAction::OrgWebhookSet,
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

#[utoipa::path(
    delete,
    path = "/api/v1/webhook",
    operation_id = "deleteWebhook",
    summary = "Remove the organization's webhook; its pending deliveries are dropped (scope orders)",
    responses(
        (status = 200, description = "removed", body = WebhookRemoved),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn delete(
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
            crate::audit::AuditAction::OrgWebhookRemoved,
            &format!("{dropped} pending deliveries dropped"),
        )
        .await?;
        Ok(Some(dropped))
    })
    .await?
    .ok_or(not_found("webhook"))?;
    Ok(HttpResponse::Ok().json(WebhookRemoved {
        removed: true,
        dropped_deliveries: dropped,
    }))
}

/// The audit row of an API change, in the change's transaction: the actor
/// is the token's name, as on reservations.
async fn record(
    conn: &mut sqlx::PgConnection,
    req: &HttpRequest,
    client: &ApiClient,
    action: crate::audit::AuditAction,
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
