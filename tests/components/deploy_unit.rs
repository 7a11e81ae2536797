//! The systemd unit of the repository, checked by
//! `systemd-analyze verify` (missing, the test fails: `helpers::needs`).

use std::path::Path;

const UNIT: &str = include_str!("../../deploy/poolkeeper.service");

#[test]
fn the_systemd_unit_is_hardened_and_verifies() {
    for directive in [
        "ExecStart=/usr/local/bin/poolkeeper serve",
        "EnvironmentFile=/etc/poolkeeper/poolkeeper.env",
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
    ] {
        assert!(
            UNIT.lines().any(|l| l.trim() == directive),
            "{directive} missing"
        );
    }
    let analyze = crate::helpers::required(
        "systemd-analyze",
        ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
            .into_iter()
            .find(|p| Path::new(p).is_file()),
        "apt-get install -y --no-install-recommends systemd",
    );
    // verify checks that ExecStart's binary exists: point it at the one
    // cargo built, in a copy of the unit with the same name.
    let dir = std::env::temp_dir().join(format!("poolkeeper-unit-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).expect("dir");
    let unit = dir.join("poolkeeper.service");
    std::fs::write(
        &unit,
        UNIT.replace(
            "/usr/local/bin/poolkeeper",
            &crate::helpers::binary().display().to_string(),
        ),
    )
    .expect("write unit");
    let out = std::process::Command::new(analyze)
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{stderr}");
    // Unknown or misspelt keys are only warnings: none is allowed.
    assert!(stderr.trim().is_empty(), "systemd-analyze warned: {stderr}");
}
