//! S1-S3: staff sign in through their organization's OpenID Connect
//! provider. The protocol is the `openidconnect` crate's: discovery, the
//! authorization code flow with PKCE (S256), state and nonce, and the ID
//! token's signature (against the keys the provider publishes, read at
//! every sign-in, so a rotation needs nothing here), issuer, audience,
//! expiry and nonce. This module keeps each organization's configuration,
//! maps the configured claim to a role, and finds or creates the staff user
//! (by the provider's subject). The HTTP side is `dashboard::sso`.

use std::sync::OnceLock;
use std::time::Duration;

use openidconnect::core::{
    CoreAuthenticationFlow, CoreClient, CoreGenderClaim, CoreIdTokenVerifier,
    CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm,
};
use openidconnect::{
    AdditionalClaims, AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndSessionUrl,
    EndpointMaybeSet, EndpointNotSet, EndpointSet, IdToken, IssuerUrl, LogoutRequest, Nonce,
    PkceCodeChallenge, PkceCodeVerifier, PostLogoutRedirectUrl, ProviderMetadataWithLogout,
    RedirectUrl, Scope, TokenResponse,
};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use crate::db::Db;
use crate::domain::{Email, Role};

/// The claims of an ID token besides the standard ones, whatever they are
/// named: the role claim is the organization's choice (`groups`, `roles`,
/// ...).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(transparent)]
pub struct OtherClaims(pub serde_json::Map<String, serde_json::Value>);
impl AdditionalClaims for OtherClaims {}

type StaffIdToken = IdToken<
    OtherClaims,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;

/// A client made from discovery: authorization endpoint set, token and
/// userinfo endpoints as published.
type DiscoveredClient = CoreClient<
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// S2: who may still sign in with a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passwords {
    /// Everyone with a password, as without single sign-on.
    On,
    /// Admins only (break-glass, for when the provider is down).
    Admins,
}

impl Passwords {
    pub fn as_str(self) -> &'static str {
        match self {
            Passwords::On => "on",
            Passwords::Admins => "admins",
        }
    }
    pub fn parse(s: &str) -> Result<Passwords, SsoError> {
        match s {
            "on" => Ok(Passwords::On),
            "admins" => Ok(Passwords::Admins),
            other => Err(SsoError::Invalid(format!(
                "--passwords must be on or admins, not {other:?}"
            ))),
        }
    }
}

/// An organization's single sign-on, as stored (`org_sso`). The client
/// secret is not here: only the file it is read from.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Config {
    pub org_id: i64,
    pub issuer: String,
    pub client_id: String,
    pub client_secret_file: String,
    pub claim: String,
    /// The claim's values that give each role (any one of them does).
    pub admin_values: Vec<String>,
    pub support_values: Vec<String>,
    pub viewer_values: Vec<String>,
    pub passwords: String,
}

/// The columns of `Config`, from `org_sso s`. A single value that is not
/// among its role's list was written by the previous release's binary
/// (which knows one value per role): it is then the list.
const CONFIG_COLUMNS: &str = "s.org_id, s.issuer, s.client_id, s.client_secret_file, s.claim,
    CASE WHEN s.admin_value IS NOT NULL AND NOT s.admin_value = ANY (s.admin_values)
         THEN ARRAY[s.admin_value] ELSE s.admin_values END AS admin_values,
    CASE WHEN s.support_value IS NOT NULL AND NOT s.support_value = ANY (s.support_values)
         THEN ARRAY[s.support_value] ELSE s.support_values END AS support_values,
    CASE WHEN s.viewer_value IS NOT NULL AND NOT s.viewer_value = ANY (s.viewer_values)
         THEN ARRAY[s.viewer_value] ELSE s.viewer_values END AS viewer_values,
    s.passwords";

impl Config {
    /// S1: the highest role any of `values` maps to.
    pub fn role_for(&self, values: &[String]) -> Option<Role> {
        let has = |mapped: &[String]| mapped.iter().any(|m| values.contains(m));
        if has(&self.admin_values) {
            Some(Role::Admin)
        } else if has(&self.support_values) {
            Some(Role::Support)
        } else if has(&self.viewer_values) {
            Some(Role::Viewer)
        } else {
            None
        }
    }

    /// The roles and the values that give them, highest first, mapped ones
    /// only.
    pub fn mapping(&self) -> Vec<(&'static str, &[String])> {
        [
            ("admin", self.admin_values.as_slice()),
            ("support", self.support_values.as_slice()),
            ("viewer", self.viewer_values.as_slice()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect()
    }

    /// What the organization maps, in words:
    /// `admin: "pk-admins" or "ops", support: "pk-support"`.
    pub fn expected(&self) -> String {
        self.mapping()
            .iter()
            .map(|(role, values)| {
                let values = values
                    .iter()
                    .map(|v| format!("{v:?}"))
                    .collect::<Vec<_>>()
                    .join(" or ");
                format!("{role}: {values}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// S2: password sign-in is kept for admins only.
    pub fn admins_only_passwords(&self) -> bool {
        self.passwords == Passwords::Admins.as_str()
    }

    /// The client secret, read from its file at each use (so that it can be
    /// rotated without touching the database). Never logged: `ClientSecret`
    /// prints as redacted, and errors name the file, not its content.
    fn secret(&self) -> Result<ClientSecret, SsoError> {
        read_secret(&self.client_secret_file).map(ClientSecret::new)
    }
}

/// The first line of `path`, trimmed; an empty file is an error.
pub fn read_secret(path: &str) -> Result<String, SsoError> {
    let text = std::fs::read_to_string(path).map_err(|e| SsoError::Secret {
        path: path.to_owned(),
        detail: e.kind().to_string(),
    })?;
    let secret = text.lines().next().unwrap_or("").trim().to_owned();
    if secret.is_empty() {
        return Err(SsoError::Secret {
            path: path.to_owned(),
            detail: "the file is empty".to_owned(),
        });
    }
    Ok(secret)
}

#[derive(Debug, thiserror::Error)]
pub enum SsoError {
    #[error("{0}")]
    Invalid(String),
    #[error("the client secret file {path} cannot be read ({detail})")]
    Secret { path: String, detail: String },
    #[error("the identity provider at {issuer} cannot be used right now: {detail}")]
    Unreachable { issuer: String, detail: String },
    #[error("the identity provider refused to complete the sign-in: {0}")]
    Exchange(String),
    #[error("the ID token was refused: {0}")]
    Token(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The organization's configuration, if it has one.
pub async fn config(db: &Db, org_id: i64) -> Result<Option<Config>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {CONFIG_COLUMNS} FROM org_sso s WHERE s.org_id = $1"
    )))
    .bind(org_id)
    .fetch_optional(db)
    .await
}

/// The configuration of the organization named `slug`, if it has one.
pub async fn config_by_slug(db: &Db, slug: &str) -> Result<Option<Config>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {CONFIG_COLUMNS} FROM org_sso s JOIN organizations o ON o.id = s.org_id
          WHERE o.slug = $1"
    )))
    .bind(slug)
    .fetch_optional(db)
    .await
}

/// A configuration to store (`poolkeeper org sso`).
pub struct Setting<'a> {
    pub issuer: &'a str,
    pub client_id: &'a str,
    pub client_secret_file: &'a str,
    pub claim: &'a str,
    /// The claim's values that give each role; empty: the role is not
    /// given by the provider.
    pub admin_values: &'a [&'a str],
    pub support_values: &'a [&'a str],
    pub viewer_values: &'a [&'a str],
    pub passwords: Passwords,
}

impl Setting<'_> {
    /// Checks what the database cannot: an https issuer (http only on a
    /// loopback address), a readable secret file, at least one role mapped.
    pub fn check(&self) -> Result<(), SsoError> {
        let url = url::Url::parse(self.issuer)
            .map_err(|e| SsoError::Invalid(format!("--issuer {:?}: {e}", self.issuer)))?;
        let loopback = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => false,
        };
        if !(url.scheme() == "https" || (url.scheme() == "http" && loopback)) {
            return Err(SsoError::Invalid(format!(
                "--issuer {:?} must be an https URL (http only on a loopback address, for tests)",
                self.issuer
            )));
        }
        if self.issuer.contains('{') {
            return Err(SsoError::Invalid(format!(
                "--issuer {:?} holds a placeholder: give the issuer of your tenant, as its \
                 discovery document names it (Entra ID: https://login.microsoftonline.com/<tenant id>/v2.0)",
                self.issuer
            )));
        }
        if self.client_id.trim().is_empty() {
            return Err(SsoError::Invalid("--client-id is empty".to_owned()));
        }
        if self.claim.trim().is_empty() {
            return Err(SsoError::Invalid("--claim is empty".to_owned()));
        }
        self.check_values()?;
        read_secret(self.client_secret_file)?;
        Ok(())
    }
}

impl Setting<'_> {
    /// At least one value, none blank, none given twice (for one role or
    /// for two: which role a value gives must be plain).
    fn check_values(&self) -> Result<(), SsoError> {
        let roles = [
            ("admin", self.admin_values),
            ("support", self.support_values),
            ("viewer", self.viewer_values),
        ];
        if roles.iter().all(|(_, v)| v.is_empty()) {
            return Err(SsoError::Invalid(
                "map at least one role: --role admin=VALUE, --role support=VALUE or --role viewer=VALUE"
                    .to_owned(),
            ));
        }
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for (role, values) in roles {
            for value in values {
                if value.trim().is_empty() {
                    return Err(SsoError::Invalid(format!(
                        "--role {role}=: the value is empty"
                    )));
                }
                if value.chars().count() > MAX_VALUE_CHARS {
                    return Err(SsoError::Invalid(format!(
                        "--role {role}=...: a value is at most {MAX_VALUE_CHARS} characters"
                    )));
                }
                if let Some((before, _)) = seen.iter().find(|(_, v)| v == value) {
                    return Err(SsoError::Invalid(if *before == role {
                        format!("--role {role}={value} is given twice")
                    } else {
                        format!(
                            "the value {value:?} is given for {before} and for {role}: give each value one role"
                        )
                    }));
                }
                seen.push((role, value));
            }
        }
        Ok(())
    }
}

/// The longest value of the role claim a role is mapped to (a group's
/// distinguished name can be long; a pasted document cannot).
const MAX_VALUE_CHARS: usize = 1000;

/// Stores `setting` for the organization, audited in the same transaction
/// (the secret file's path is audited, never its content).
pub async fn set(db: &Db, org_id: i64, setting: &Setting<'_>, actor: &str) -> Result<(), SsoError> {
    setting.check()?;
    let mut tx = db.begin().await?;
    sqlx::query(
        "INSERT INTO org_sso (org_id, issuer, client_id, client_secret_file, claim, admin_value,
                              support_value, viewer_value, passwords, admin_values,
                              support_values, viewer_values)
         VALUES ($1, $2, $3, $4, $5, $6[1], $7[1], $8[1], $9, $6, $7, $8)
         ON CONFLICT (org_id) DO UPDATE SET issuer = EXCLUDED.issuer, client_id = EXCLUDED.client_id,
             client_secret_file = EXCLUDED.client_secret_file, claim = EXCLUDED.claim,
             admin_value = EXCLUDED.admin_value, support_value = EXCLUDED.support_value,
             viewer_value = EXCLUDED.viewer_value, passwords = EXCLUDED.passwords,
             admin_values = EXCLUDED.admin_values, support_values = EXCLUDED.support_values,
             viewer_values = EXCLUDED.viewer_values, updated_at = clock_timestamp()",
    )
    .bind(org_id)
    .bind(setting.issuer)
    .bind(setting.client_id)
    .bind(setting.client_secret_file)
    .bind(setting.claim)
    .bind(setting.admin_values)
    .bind(setting.support_values)
    .bind(setting.viewer_values)
    .bind(setting.passwords.as_str())
    .execute(&mut *tx)
    .await?;
    let roles = [
        ("admin", setting.admin_values),
        ("support", setting.support_values),
        ("viewer", setting.viewer_values),
    ]
    .iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(role, v)| format!("{role} {}", v.join(" or ")))
    .collect::<Vec<_>>()
    .join(", ");
    let detail = format!(
        "issuer {}, client {}, secret file {}, claim {} ({roles}), passwords {}",
        setting.issuer,
        setting.client_id,
        setting.client_secret_file,
        setting.claim,
        setting.passwords.as_str()
    );
    crate::audit::record(
        &mut tx,
        &crate::audit::Entry {
            org_id: Some(org_id),
            actor,
            action: crate::audit::AuditAction::OrgSsoSet,
            object: &format!("org:{org_id}"),
            source_addr: "command line",
            detail: Some(&detail),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Removes the organization's single sign-on; false when it had none.
/// Users made by it stay (an admin disables them); they can no longer
/// sign in, having no password anyone knows.
pub async fn remove(db: &Db, org_id: i64, actor: &str) -> Result<bool, sqlx::Error> {
    let mut tx = db.begin().await?;
    let gone = sqlx::query("DELETE FROM org_sso WHERE org_id = $1")
        .bind(org_id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
        > 0;
    sqlx::query("DELETE FROM sso_pending WHERE org_id = $1")
        .bind(org_id)
        .execute(&mut *tx)
        .await?;
    if gone {
        crate::audit::record(
            &mut tx,
            &crate::audit::Entry {
                org_id: Some(org_id),
                actor,
                action: crate::audit::AuditAction::OrgSsoRemoved,
                object: &format!("org:{org_id}"),
                source_addr: "command line",
                detail: None,
            },
        )
        .await?;
    }
    tx.commit().await?;
    Ok(gone)
}

/// The HTTP client for the provider: no redirects (discovery and the token
/// endpoint answer directly; following them would let a redirect choose
/// where the code goes), short timeouts, no proxy from the environment, and
/// no idle connections kept: sign-ins are rare, and a kept connection that
/// the provider closed meanwhile fails the next request.
fn http_client() -> Result<&'static reqwest::Client, SsoError> {
    static CLIENT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .pool_max_idle_per_host(0)
                .connect_timeout(Duration::from_secs(3))
                .timeout(Duration::from_secs(5))
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| SsoError::Unreachable {
            issuer: String::new(),
            detail: format!("no HTTP client: {e}"),
        })
}

/// The provider as discovered for one sign-in (or sign-out): its endpoints
/// and keys as published now.
pub struct Provider {
    client: DiscoveredClient,
    end_session: Option<EndSessionUrl>,
}

/// Discovery of `config`'s issuer. The issuer in the document must be the
/// configured one exactly (the crate checks it), which is what catches an
/// Entra ID issuer with `{tenantid}` left in it.
pub async fn discover(config: &Config, redirect_uri: &str) -> Result<Provider, SsoError> {
    let unreachable = |detail: String| SsoError::Unreachable {
        issuer: config.issuer.clone(),
        detail,
    };
    let issuer = IssuerUrl::new(config.issuer.clone()).map_err(|e| unreachable(e.to_string()))?;
    let http = http_client()?;
    let metadata = ProviderMetadataWithLogout::discover_async(issuer, http)
        .await
        .map_err(|e| unreachable(describe(&e)))?;
    let end_session = metadata.additional_metadata().end_session_endpoint.clone();
    let redirect =
        RedirectUrl::new(redirect_uri.to_owned()).map_err(|e| unreachable(e.to_string()))?;
    let client = CoreClient::from_provider_metadata(
        metadata,
        ClientId::new(config.client_id.clone()),
        Some(config.secret()?),
    )
    .set_redirect_uri(redirect);
    Ok(Provider {
        client,
        end_session,
    })
}

/// An error and its causes on one line (reqwest's own message says little).
fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A sign-in sent to the provider: where to send the browser, and what its
/// callback must match.
pub struct Authorization {
    pub url: String,
    pub state: String,
    pub nonce: String,
    pub pkce_verifier: String,
}

/// Who the provider says signed in, from a verified ID token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub subject: String,
    pub email: Option<String>,
    /// The `name` claim, as sent.
    pub name: Option<String>,
    /// The values of the role claim; `None` when the token has no such claim.
    pub values: Option<Vec<String>>,
}

/// The longest display name kept; a longer `name` claim is cut.
const MAX_NAME_CHARS: usize = 200;

/// S1: the name a user is shown by: the ID token's `name`, without control
/// or direction-changing characters (which would let a name rearrange the
/// audit log around it) and cut to 200 characters; the email when that
/// leaves nothing.
pub fn display_name(name: Option<&str>, email: &str) -> String {
    let invisible = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    let kept: String = name
        .unwrap_or("")
        .chars()
        .filter(|c| !invisible(*c))
        .collect();
    let cut: String = kept.trim().chars().take(MAX_NAME_CHARS).collect();
    let cut = cut.trim_end();
    if cut.is_empty() {
        email.to_owned()
    } else {
        cut.to_owned()
    }
}

impl Provider {
    /// S1: the authorization URL of a code flow with PKCE S256, a random
    /// state and a random nonce.
    pub fn authorize(&self) -> Authorization {
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let (url, state, nonce) = self
            .client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .add_scope(Scope::new("email".to_owned()))
            .add_scope(Scope::new("profile".to_owned()))
            .set_pkce_challenge(challenge)
            .url();
        Authorization {
            url: url.to_string(),
            state: state.secret().clone(),
            nonce: nonce.secret().clone(),
            pkce_verifier: verifier.secret().clone(),
        }
    }

    /// S1: exchanges the code (with the PKCE verifier) for tokens and
    /// verifies the ID token against the keys just discovered.
    pub async fn sign_in(
        &self,
        code: &str,
        pkce_verifier: &str,
        nonce: &str,
        claim: &str,
    ) -> Result<Identity, SsoError> {
        let http = http_client()?;
        let response = self
            .client
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .map_err(|e| SsoError::Exchange(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(pkce_verifier.to_owned()))
            .request_async(http)
            .await
            .map_err(|e| SsoError::Exchange(describe(&e)))?;
        let token = response
            .id_token()
            .ok_or_else(|| SsoError::Token("the provider sent no ID token".to_owned()))?;
        // Re-read with every claim kept: the role claim is not a standard one.
        let raw = serde_json::to_value(token)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .ok_or_else(|| SsoError::Token("the ID token cannot be read".to_owned()))?;
        verify(
            &raw,
            &self.client.id_token_verifier(),
            &Nonce::new(nonce.to_owned()),
            claim,
        )
    }

    /// S3: the provider's end-session URL (RP-initiated logout), when it
    /// publishes one.
    pub fn end_session_url(&self, client_id: &str, post_logout: &str) -> Option<String> {
        let endpoint = self.end_session.clone()?;
        let mut request =
            LogoutRequest::from(endpoint).set_client_id(ClientId::new(client_id.to_owned()));
        if let Ok(back) = PostLogoutRedirectUrl::new(post_logout.to_owned()) {
            request = request.set_post_logout_redirect_uri(back);
        }
        Some(request.http_get_url().to_string())
    }
}

/// S1: verifies an ID token (signature against `verifier`'s keys and
/// algorithms, issuer, audience, expiry, nonce) and reads who it names and
/// the values of `claim`.
pub fn verify(
    raw: &str,
    verifier: &CoreIdTokenVerifier<'_>,
    nonce: &Nonce,
    claim: &str,
) -> Result<Identity, SsoError> {
    let token: StaffIdToken = raw
        .parse()
        .map_err(|e| SsoError::Token(format!("not an ID token: {e}")))?;
    let claims = token
        .claims(verifier, nonce)
        .map_err(|e| SsoError::Token(describe(&e)))?;
    let values = claims.additional_claims().0.get(claim).map(claim_values);
    Ok(Identity {
        subject: claims.subject().as_str().to_owned(),
        email: claims.email().map(|e| e.as_str().to_owned()),
        name: claims
            .name()
            .and_then(|n| n.get(None))
            .map(|n| n.as_str().to_owned()),
        values,
    })
}

/// A claim's values as text: a list's strings (and numbers), or one
/// string. Other shapes give nothing, so they map to no role.
fn claim_values(value: &serde_json::Value) -> Vec<String> {
    let one = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    match value {
        serde_json::Value::Array(items) => items.iter().filter_map(one).collect(),
        other => one(other).into_iter().collect(),
    }
}

/// A sign-in under way: stored at the redirect to the provider, consumed by
/// its callback. Also purges those older than `PENDING_MINUTES`.
pub async fn begin(
    db: &Db,
    org_id: i64,
    auth: &Authorization,
    state_hash: &[u8],
    browser_hash: &[u8],
    start_id: i64,
) -> Result<(), sqlx::Error> {
    let mut tx = db.begin().await?;
    // The start counted against its address (`dashboard::throttle`), which
    // the sign-in's completion deletes by this state.
    sqlx::query("UPDATE sso_starts SET state_hash = $2 WHERE id = $1")
        .bind(start_id)
        .bind(state_hash)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "DELETE FROM sso_pending WHERE created_at < clock_timestamp() - make_interval(mins => $1)",
    )
    .bind(PENDING_MINUTES)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO sso_pending (state_hash, browser_hash, org_id, nonce, pkce_verifier)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(state_hash)
    .bind(browser_hash)
    .bind(org_id)
    .bind(&auth.nonce)
    .bind(&auth.pkce_verifier)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// A sign-in completed: its start no longer counts against its address.
pub async fn completed(conn: &mut PgConnection, state_hash: &[u8]) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM sso_starts WHERE state_hash = $1")
        .bind(state_hash)
        .execute(conn)
        .await?;
    Ok(())
}

/// How long a sign-in may stay at the provider.
pub const PENDING_MINUTES: i32 = 10;

/// A pending sign-in, consumed.
#[derive(Debug, sqlx::FromRow)]
pub struct Pending {
    pub org_id: i64,
    pub nonce: String,
    pub pkce_verifier: String,
}

/// Takes the pending sign-in of `state_hash` if it was started by this
/// browser and is not older than `PENDING_MINUTES`: single use, so a
/// replayed callback finds nothing. Another browser's state is left alone.
pub async fn take(
    db: &Db,
    state_hash: &[u8],
    browser_hash: &[u8],
) -> Result<Option<Pending>, sqlx::Error> {
    sqlx::query_as(
        "DELETE FROM sso_pending
          WHERE state_hash = $1 AND browser_hash = $2
            AND created_at > clock_timestamp() - make_interval(mins => $3)
          RETURNING org_id, nonce, pkce_verifier",
    )
    .bind(state_hash)
    .bind(browser_hash)
    .bind(PENDING_MINUTES)
    .fetch_optional(db)
    .await
}

/// The staff user a sign-in lands on.
#[derive(Debug)]
pub enum Account {
    Ready {
        user_id: i64,
        email: String,
        /// The name the user is shown by (`display_name`).
        name: String,
        /// Made by this sign-in.
        created: bool,
        /// The role before this sign-in, when it changed.
        previous_role: Option<String>,
    },
    /// Refused, with the reason for the person signing in.
    Refused(String),
}

#[derive(sqlx::FromRow)]
struct Known {
    id: i64,
    email: String,
    role: String,
    disabled: bool,
}

/// S1: the user of `org_id` the provider's `subject` names, with `role`
/// and the provider's email, on the caller's transaction: found by the
/// subject, else a user of this organization with that email and no
/// subject yet (linked), else created with a password no one knows.
pub async fn account_on(
    conn: &mut PgConnection,
    org_id: i64,
    identity: &Identity,
    role: Role,
) -> Result<Account, SsoError> {
    let email = match identity.email.as_deref().map(Email::parse) {
        Some(Ok(e)) => Some(e),
        Some(Err(_)) | None => None,
    };
    let known = match find_known(conn, org_id, identity, email.as_ref()).await? {
        Lookup::Found(known) => known,
        Lookup::Refused(why) => return Ok(Account::Refused(why)),
        Lookup::Absent => {
            let Some(email) = email else {
                return Ok(Account::Refused(
                    "Your identity provider sent no usable email address (the email claim), \
                     which a new poolkeeper account needs; ask the provider's administrator."
                        .to_owned(),
                ));
            };
            return create_user(conn, org_id, identity, role, &email).await;
        }
    };
    if known.disabled {
        return Ok(Account::Refused(
            "Your poolkeeper account is disabled; ask an admin of your organization.".to_owned(),
        ));
    }
    refresh_user(conn, known, identity, email.as_ref(), role).await
}

/// Where the search for an existing user ended.
enum Lookup {
    Found(Known),
    /// No user yet: one may be created.
    Absent,
    /// The email is another account's: the reason for the person.
    Refused(String),
}

/// The user the subject names, else one of `org_id` with the provider's
/// email and no subject yet, which is linked to the subject here.
async fn find_known(
    conn: &mut PgConnection,
    org_id: i64,
    identity: &Identity,
    email: Option<&Email>,
) -> Result<Lookup, SsoError> {
    let by_subject: Option<Known> = sqlx::query_as(
        "SELECT id, email, role, disabled_at IS NOT NULL AS disabled FROM users
          WHERE org_id = $1 AND sso_subject = $2 FOR UPDATE",
    )
    .bind(org_id)
    .bind(&identity.subject)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(k) = by_subject {
        return Ok(Lookup::Found(k));
    }
    let Some(email) = email else {
        return Ok(Lookup::Absent);
    };
    let by_email: Option<(Known, i64, Option<String>)> =
        sqlx::query_as::<_, (i64, String, String, bool, i64, Option<String>)>(
            "SELECT id, email, role, disabled_at IS NOT NULL, org_id, sso_subject FROM users
          WHERE email = $1 FOR UPDATE",
        )
        .bind(email.as_str())
        .fetch_optional(&mut *conn)
        .await?
        .map(|(id, email, role, disabled, org, subject)| {
            (
                Known {
                    id,
                    email,
                    role,
                    disabled,
                },
                org,
                subject,
            )
        });
    match by_email {
        Some((k, org, None)) if org == org_id => {
            sqlx::query("UPDATE users SET sso_subject = $2 WHERE id = $1")
                .bind(k.id)
                .bind(&identity.subject)
                .execute(&mut *conn)
                .await?;
            Ok(Lookup::Found(k))
        }
        Some(_) => Ok(Lookup::Refused(format!(
            "The email {} belongs to another poolkeeper account; ask an admin.",
            email.as_str()
        ))),
        None => Ok(Lookup::Absent),
    }
}

/// A new user of `org_id` for the subject, with the provider's email.
async fn create_user(
    conn: &mut PgConnection,
    org_id: i64,
    identity: &Identity,
    role: Role,
    email: &Email,
) -> Result<Account, SsoError> {
    // A password no one knows: the table wants an argon2id hash, and
    // password sign-in must never open this account.
    // argon2 is deliberately slow: off the async workers.
    let unknowable = tokio::task::spawn_blocking(|| crate::staff::hash_password(&random_secret()))
        .await
        .map_err(|e| SsoError::Invalid(e.to_string()))?
        .map_err(|e| SsoError::Invalid(e.to_string()))?;
    let name = display_name(identity.name.as_deref(), email.as_str());
    let id: Result<i64, sqlx::Error> = sqlx::query_scalar(
        "INSERT INTO users (org_id, email, role, password_hash, sso_subject, display_name)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(org_id)
    .bind(email.as_str())
    .bind(role.as_str())
    .bind(unknowable)
    .bind(&identity.subject)
    .bind(&name)
    .fetch_one(&mut *conn)
    .await;
    let id = match id {
        Ok(id) => id,
        // Two first sign-ins of one person at once: the other made it.
        Err(e) if crate::db::violated_unique(&e).is_some() => return Ok(raced()),
        Err(e) => return Err(e.into()),
    };
    Ok(Account::Ready {
        user_id: id,
        email: email.as_str().to_owned(),
        name,
        created: true,
        previous_role: None,
    })
}

/// An existing, enabled user brought in line with this sign-in.
async fn refresh_user(
    conn: &mut PgConnection,
    known: Known,
    identity: &Identity,
    email: Option<&Email>,
    role: Role,
) -> Result<Account, SsoError> {
    // Recomputed at every sign-in: the role, the name, and the email when
    // the provider's changed (unless another account has it).
    let new_email = match email {
        Some(e) if e.as_str() != known.email => {
            let taken: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM users WHERE email = $1)")
                    .bind(e.as_str())
                    .fetch_one(&mut *conn)
                    .await?;
            if taken {
                return Ok(Account::Refused(format!(
                    "The email {} belongs to another poolkeeper account; ask an admin.",
                    e.as_str()
                )));
            }
            e.as_str().to_owned()
        }
        _ => known.email.clone(),
    };
    let name = display_name(identity.name.as_deref(), &new_email);
    let updated =
        sqlx::query("UPDATE users SET role = $2, email = $3, display_name = $4 WHERE id = $1")
            .bind(known.id)
            .bind(role.as_str())
            .bind(&new_email)
            .bind(&name)
            .execute(&mut *conn)
            .await;
    match updated {
        Ok(_) => {}
        Err(e) if crate::db::violated_unique(&e).is_some() => return Ok(raced()),
        Err(e) => return Err(e.into()),
    }
    Ok(Account::Ready {
        user_id: known.id,
        email: new_email,
        name,
        created: false,
        previous_role: (known.role != role.as_str()).then_some(known.role),
    })
}

/// A unique index refused the write because another sign-in wrote first:
/// nothing of this one is kept, and signing in again finds that user.
fn raced() -> Account {
    Account::Refused(
        "Another sign-in with this account was completed at the same moment; nothing of this \
         one was kept: sign in again."
            .to_owned(),
    )
}

fn random_secret() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    //! The ID token checks of `verify` alone, on tokens made here and
    //! signed with keys made here, against a key set we control (another
    //! audience or issuer, an expired token, a wrong nonce, `alg: none`, an
    //! unknown key). The same refusals through HTTP, on the real provider's
    //! tokens changed by a man in the middle, are in
    //! tests/components/sso.rs.
    use super::*;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use chrono::{Duration as Span, Utc};
    use openidconnect::core::{
        CoreIdToken, CoreIdTokenClaims, CoreJsonWebKeySet, CoreRsaPrivateSigningKey,
    };
    use openidconnect::{
        Audience, EmptyAdditionalClaims, EndUserEmail, EndUserName, JsonWebKeyId,
        PrivateSigningKey, StandardClaims, SubjectIdentifier,
    };

    const ISSUER: &str = "https://idp.example";
    const CLIENT: &str = "poolkeeper";
    const NONCE: &str = "the-nonce";

    fn key(kid: &str) -> CoreRsaPrivateSigningKey {
        let pem = match kid {
            "known" => include_str!("../tests/fixtures/sso/known-key.pem"),
            _ => include_str!("../tests/fixtures/sso/unknown-key.pem"),
        };
        CoreRsaPrivateSigningKey::from_pem(pem, Some(JsonWebKeyId::new(kid.to_owned())))
            .expect("a test key fixture")
    }

    /// What the provider publishes: the "known" key only.
    fn keys() -> CoreJsonWebKeySet {
        CoreJsonWebKeySet::new(vec![key("known").as_verification_key()])
    }

    fn verifier(keys: &CoreJsonWebKeySet) -> CoreIdTokenVerifier<'_> {
        CoreIdTokenVerifier::new_confidential_client(
            ClientId::new(CLIENT.to_owned()),
            ClientSecret::new("the-client-secret".to_owned()),
            IssuerUrl::new(ISSUER.to_owned()).expect("issuer"),
            keys.clone(),
        )
    }

    struct Made {
        issuer: &'static str,
        audience: &'static str,
        expires_in: Span,
        nonce: &'static str,
        kid: &'static str,
    }

    fn good() -> Made {
        Made {
            issuer: ISSUER,
            audience: CLIENT,
            expires_in: Span::minutes(5),
            nonce: NONCE,
            kid: "known",
        }
    }

    /// A signed ID token with a `groups` claim of ["pk-support"].
    fn token(m: Made) -> String {
        let now = Utc::now();
        let claims = openidconnect::IdTokenClaims::new(
            IssuerUrl::new(m.issuer.to_owned()).expect("issuer"),
            vec![Audience::new(m.audience.to_owned())],
            now + m.expires_in,
            now - Span::seconds(10),
            StandardClaims::<CoreGenderClaim>::new(SubjectIdentifier::new("user-1".to_owned()))
                .set_email(Some(EndUserEmail::new("ana@corp.example".to_owned())))
                .set_name(Some(EndUserName::new("Ana Lima".to_owned()).into())),
            OtherClaims(
                serde_json::json!({"groups": ["pk-support", "everyone"]})
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
            ),
        )
        .set_nonce(Some(Nonce::new(m.nonce.to_owned())));
        let token: StaffIdToken = IdToken::new(
            claims,
            &key(m.kid),
            CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
            None,
            None,
        )
        .expect("sign");
        serde_json::to_value(&token)
            .expect("serialize")
            .as_str()
            .expect("a string")
            .to_owned()
    }

    fn check(raw: &str) -> Result<Identity, SsoError> {
        let keys = keys();
        verify(
            raw,
            &verifier(&keys),
            &Nonce::new(NONCE.to_owned()),
            "groups",
        )
    }

    #[test]
    fn a_good_token_names_the_subject_and_the_claims_values() {
        let id = check(&token(good())).expect("a good token passes");
        assert_eq!(id.subject, "user-1");
        assert_eq!(id.email.as_deref(), Some("ana@corp.example"));
        assert_eq!(id.name.as_deref(), Some("Ana Lima"));
        assert_eq!(
            id.values,
            Some(vec!["pk-support".to_owned(), "everyone".to_owned()])
        );
    }

    fn refused(raw: &str, why: &str) -> String {
        match check(raw) {
            Err(SsoError::Token(text)) => text,
            other => panic!("{why}: expected a refused token, got {other:?}"),
        }
    }

    #[test]
    fn another_audience_is_refused() {
        let text = refused(
            &token(Made {
                audience: "another-app",
                ..good()
            }),
            "another audience",
        );
        assert!(text.contains("audience") || text.contains("aud"), "{text}");
    }

    #[test]
    fn another_issuer_is_refused() {
        refused(
            &token(Made {
                issuer: "https://evil.example",
                ..good()
            }),
            "another issuer",
        );
    }

    #[test]
    fn an_expired_token_is_refused() {
        let text = refused(
            &token(Made {
                expires_in: Span::minutes(-1),
                ..good()
            }),
            "expired",
        );
        assert!(text.contains("xpire"), "{text}");
    }

    #[test]
    fn a_wrong_nonce_is_refused() {
        let text = refused(
            &token(Made {
                nonce: "another-nonce",
                ..good()
            }),
            "wrong nonce",
        );
        assert!(text.to_lowercase().contains("nonce"), "{text}");
    }

    #[test]
    fn a_token_signed_by_an_unknown_key_is_refused() {
        refused(
            &token(Made {
                kid: "unknown",
                ..good()
            }),
            "unknown key",
        );
    }

    #[test]
    fn an_unsigned_token_is_refused() {
        // The good token's claims under `alg: none` and no signature.
        let good = token(good());
        let payload = good.split('.').nth(1).expect("a payload");
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        refused(&format!("{header}.{payload}."), "alg none");
        // And the same with the good signature glued back on.
        let signature = good.split('.').nth(2).expect("a signature");
        refused(
            &format!("{header}.{payload}.{signature}"),
            "alg none, signed",
        );
    }

    #[test]
    fn a_token_with_a_changed_claim_is_refused() {
        let good = token(good());
        let parts: Vec<&str> = good.split('.').collect();
        let mut claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).expect("base64"))
                .expect("json");
        claims["groups"] = serde_json::json!(["pk-admins"]);
        let forged = URL_SAFE_NO_PAD.encode(claims.to_string());
        refused(
            &format!("{}.{forged}.{}", parts[0], parts[2]),
            "forged claim",
        );
    }

    #[test]
    fn the_standard_core_token_type_is_not_what_we_read() {
        // The core type drops the role claim: `verify` reads OtherClaims.
        let raw = token(good());
        let core: CoreIdToken = raw.parse().expect("parses as a core token");
        let keys = keys();
        let v = verifier(&keys);
        let claims: &CoreIdTokenClaims = core
            .claims(&v, &Nonce::new(NONCE.to_owned()))
            .expect("verifies");
        let _: &EmptyAdditionalClaims = claims.additional_claims();
    }

    fn config(admin: &[&str], support: &[&str], viewer: &[&str]) -> Config {
        let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        Config {
            org_id: 1,
            issuer: ISSUER.to_owned(),
            client_id: CLIENT.to_owned(),
            client_secret_file: "/dev/null".to_owned(),
            claim: "groups".to_owned(),
            admin_values: owned(admin),
            support_values: owned(support),
            viewer_values: owned(viewer),
            passwords: "on".to_owned(),
        }
    }

    #[test]
    fn the_highest_mapped_role_wins() {
        let c = config(&["admins"], &["support"], &["staff"]);
        let v = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(c.role_for(&v(&["staff", "admins"])), Some(Role::Admin));
        assert_eq!(c.role_for(&v(&["staff", "support"])), Some(Role::Support));
        assert_eq!(c.role_for(&v(&["staff"])), Some(Role::Viewer));
        assert_eq!(c.role_for(&v(&["Admins", "other"])), None, "exact match");
        assert_eq!(c.role_for(&[]), None);
        let only_viewer = config(&[], &[], &["staff"]);
        assert_eq!(only_viewer.role_for(&v(&["admins"])), None);
        assert_eq!(
            c.expected(),
            r#"admin: "admins", support: "support", viewer: "staff""#
        );
    }

    #[test]
    fn any_of_a_roles_values_gives_it() {
        let c = config(&["pk-admins", "ops"], &[], &["staff", "contractors"]);
        let v = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(c.role_for(&v(&["ops"])), Some(Role::Admin));
        assert_eq!(c.role_for(&v(&["pk-admins"])), Some(Role::Admin));
        assert_eq!(c.role_for(&v(&["contractors"])), Some(Role::Viewer));
        assert_eq!(
            c.role_for(&v(&["contractors", "ops"])),
            Some(Role::Admin),
            "the highest wins"
        );
        assert_eq!(c.role_for(&v(&["pk-support"])), None);
        assert_eq!(
            c.expected(),
            r#"admin: "pk-admins" or "ops", viewer: "staff" or "contractors""#
        );
    }

    #[test]
    fn the_display_name_is_the_name_claim_cleaned_else_the_email() {
        assert_eq!(display_name(Some(" Ana Lima "), "a@x.example"), "Ana Lima");
        assert_eq!(display_name(None, "a@x.example"), "a@x.example");
        assert_eq!(display_name(Some(" \t\n"), "a@x.example"), "a@x.example");
        assert_eq!(
            display_name(Some("Ana\u{202e}nimda\u{0}\u{1b}[31m"), "a@x.example"),
            "Ananimda[31m"
        );
        let long = "é".repeat(500);
        assert_eq!(
            display_name(Some(&long), "a@x.example").chars().count(),
            MAX_NAME_CHARS
        );
    }

    #[test]
    fn claim_values_read_lists_and_single_values() {
        assert_eq!(
            claim_values(&serde_json::json!(["a", 7, {"x": 1}])),
            vec!["a", "7"]
        );
        assert_eq!(claim_values(&serde_json::json!("a")), vec!["a"]);
        assert!(claim_values(&serde_json::json!({"a": 1})).is_empty());
    }

    #[test]
    fn settings_are_checked_before_anything_is_stored() {
        let dir = std::env::temp_dir().join(format!("pk-sso-{}", random_secret()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let secret = dir.join("secret");
        std::fs::write(&secret, "s3cret\n").expect("write");
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").expect("write");
        let path = secret.to_string_lossy().into_owned();
        let empty = empty.to_string_lossy().into_owned();
        let good = Setting {
            issuer: "https://login.microsoftonline.com/0000/v2.0",
            client_id: "poolkeeper",
            client_secret_file: &path,
            claim: "groups",
            admin_values: &["a"],
            support_values: &[],
            viewer_values: &[],
            passwords: Passwords::On,
        };
        good.check().expect("a good setting");
        assert_eq!(read_secret(&path).expect("read"), "s3cret");
        let bad = |s: Setting<'_>| s.check().expect_err("refused").to_string();
        assert!(
            bad(Setting {
                issuer: "https://login.microsoftonline.com/{tenantid}/v2.0",
                ..good
            })
            .contains("placeholder")
        );
        assert!(
            bad(Setting {
                issuer: "http://idp.example",
                ..good
            })
            .contains("https")
        );
        bad(Setting {
            issuer: "http://127.0.0.1:9/",
            client_secret_file: &empty,
            ..good
        });
        assert!(
            bad(Setting {
                admin_values: &[],
                ..good
            })
            .contains("--role")
        );
        Setting {
            admin_values: &["a", "b"],
            viewer_values: &["c"],
            ..good
        }
        .check()
        .expect("several values for a role");
        assert!(
            bad(Setting {
                admin_values: &["a", "a"],
                ..good
            })
            .contains("twice")
        );
        assert!(
            bad(Setting {
                admin_values: &["a"],
                viewer_values: &["a"],
                ..good
            })
            .contains("for admin and for viewer")
        );
        assert!(
            bad(Setting {
                admin_values: &["a", " "],
                ..good
            })
            .contains("empty")
        );
        let secret_text = bad(Setting {
            client_secret_file: "/nonexistent/secret",
            ..good
        });
        assert!(secret_text.contains("/nonexistent/secret"), "{secret_text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
