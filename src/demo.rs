//! `poolkeeper demo`: a demo organization with staff, sites and a few hundred
//! machines. Idempotent: running it again changes nothing that exists.

use sqlx::PgPool;

use crate::allocator::{self, HoldSeconds, OrderSpec, ReserveOutcome, ReserveRequest};
use crate::domain::{AssetTag, Email, MachineStatus, OrderRef, Profile, Role, Site, Slug, Vendor};
use crate::inventory::{self, MachineSpec};
use crate::orgs::{self, OrgError};
use crate::staff::{self, StaffError};

pub const ORG: &str = "demo";
pub const PASSWORD: &str = "poolkeeper-demo";
pub const USERS: [(&str, Role); 3] = [
    ("admin@demo.example", Role::Admin),
    ("support@demo.example", Role::Support),
    ("viewer@demo.example", Role::Viewer),
];
const SITES: [&str; 4] = ["par1", "par2", "ams1", "fra1"];
const VENDORS: [&str; 3] = ["dell", "hpe", "supermicro"];
const PROFILES: [&str; 3] = ["epyc-9354-256g", "xeon-6430-128g", "epyc-4344p-64g"];
pub const MACHINES: usize = 360;

/// What the demo loaded, for the operator.
#[derive(Debug)]
pub struct DemoReport {
    pub org: String,
    pub machines: i64,
    /// Reservations of the demo orders DEMO-0001...
    pub reservations: i64,
    pub token: Option<String>,
}

impl DemoReport {
    pub fn print(&self) {
        println!(
            "demo organization: {} ({} machines)",
            self.org, self.machines
        );
        println!(
            "  {} reservations of demo orders (DEMO-0001 and on)",
            self.reservations
        );
        for (email, role) in USERS {
            println!("  {:<8} {email} / {PASSWORD}", role.as_str());
        }
        if let Some(token) = &self.token {
            println!("  API token (orders,inventory), shown once: {token}");
        }
    }
}

pub async fn load(pool: &PgPool) -> anyhow::Result<DemoReport> {
    let slug = Slug::parse(ORG)?;
    let org = match orgs::create(pool, &slug, "Demo Hosting", true).await {
        Ok(org) => org,
        Err(OrgError::Exists(_)) => orgs::by_slug(pool, ORG).await?,
        Err(e) => return Err(e.into()),
    };
    for (email, role) in USERS {
        match staff::create(pool, org.id, &Email::parse(email)?, role, PASSWORD).await {
            Ok(_) | Err(StaffError::Exists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for i in 0..MACHINES {
        let tag = AssetTag::parse(&format!("PK-{:05}", i + 1))?;
        if inventory::by_tag(pool, org.id, tag.as_str())
            .await?
            .is_some()
        {
            continue;
        }
        // A deterministic mix: mostly ready, some in every other status.
        let status = match i % 12 {
            7 => MachineStatus::Provisioning,
            9 => MachineStatus::Maintenance,
            10 => MachineStatus::Broken,
            11 if i % 24 == 11 => MachineStatus::Retired,
            _ => MachineStatus::Ready,
        };
        let spec = MachineSpec {
            site: Site::parse(SITES[i % SITES.len()])?,
            vendor: Vendor::parse(VENDORS[(i / 4) % VENDORS.len()])?,
            profile: Profile::parse(PROFILES[(i / 12) % PROFILES.len()])?,
            status,
        };
        inventory::upsert(pool, org.id, &tag, &spec).await?;
    }
    let has_token: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM api_tokens WHERE org_id = $1 AND name = 'demo-checkout')",
    )
    .bind(org.id)
    .fetch_one(pool)
    .await?;
    let token = if has_token {
        None
    } else {
        let scopes = [
            crate::domain::Scope::Orders,
            crate::domain::Scope::Inventory,
        ];
        Some(
            crate::tokens::create(pool, org.id, Some("demo-checkout"), &scopes)
                .await?
                .1,
        )
    };
    let reservations = demo_reservations(pool, org.id).await?;
    let machines: i64 = sqlx::query_scalar("SELECT count(*) FROM machines WHERE org_id = $1")
        .bind(org.id)
        .fetch_one(pool)
        .await?;
    Ok(DemoReport {
        org: org.slug,
        machines,
        reservations,
        token,
    })
}

/// How many demo orders get a held reservation.
pub const RESERVATIONS: usize = 12;

/// Held reservations for the demo orders DEMO-0001.., made by the allocator
/// itself (so each carries a real frozen reason), only when the demo has
/// none yet. Held for a day, so that the dashboard shows them held.
async fn demo_reservations(pool: &PgPool, org_id: i64) -> anyhow::Result<i64> {
    let existing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-%'",
    )
    .bind(org_id)
    .fetch_one(pool)
    .await?;
    if existing > 0 {
        return Ok(existing);
    }
    let mut created = 0;
    for i in 0..RESERVATIONS {
        let req = ReserveRequest {
            order_ref: OrderRef::parse(&format!("DEMO-{:04}", i + 1))?,
            spec: OrderSpec {
                site: Site::parse(SITES[i % SITES.len()])?,
                profile: Profile::parse(PROFILES[(i / SITES.len()) % PROFILES.len()])?,
                // Every third order names a vendor (dell: every site and
                // profile has ready dell machines in the demo's mix).
                vendor: (i % 3 == 2)
                    .then(|| Vendor::parse(VENDORS[0]))
                    .transpose()?,
            },
            hold: HoldSeconds::new(86_400)?,
            actor: "demo".to_owned(),
        };
        if let ReserveOutcome::Created { .. } = allocator::reserve(pool, org_id, &req).await? {
            created += 1;
        }
    }
    Ok(created)
}
