//! Service links (scope `orders`): ending one returns its machine to the
//! datacenter team as `provisioning`.

use crate::db::Db;
use actix_web::{HttpResponse, web};

use crate::api::caller::ApiClient;
use crate::api::reservations::path_id;
use crate::api::schemas::{
    Forbidden, IdPath, Invalid, NotFound, NotLiveError, Unauthorized, WriteUnavailable,
};
use crate::api::write::{Shape, write};
use crate::domain::Scope;
use crate::error::{ApiError, conflict, not_found};
use crate::reservations::{self, EndServiceError};
use crate::settings::Settings;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/services/{id}/end").route(web::post().to(end)));
}

#[utoipa::path(
    post,
    path = "/api/v1/services/{id}/end",
    operation_id = "endService",
    summary = "End a service link; the machine goes to provisioning (scope orders)",
    params(IdPath),
    responses(
        (status = 200, description = "the ended service link", body = reservations::ServiceLink),
        (status = 400, response = Invalid),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 409, description = "not_live: the link has already ended", body = NotLiveError),
        (status = 503, response = WriteUnavailable),
    )
)]
pub(crate) async fn end(
    client: ApiClient,
    settings: web::Data<Settings>,
    pool: web::Data<Db>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    client.module_call(&settings, Scope::Orders)?;
    let id = path_id(&path)?;
    let link = write(&pool, Shape::Transaction, async |tx| {
        reservations::end_service_on(tx, client.org_id, id, &client.token_name).await
    })
    .await?
    .map_err(|e| match e {
        EndServiceError::NotFound => not_found("service"),
        EndServiceError::NotLive => conflict("not_live", "the service link has already ended"),
        EndServiceError::Database(db) => db.into(),
    })?;
    Ok(HttpResponse::Ok().json(link))
}
