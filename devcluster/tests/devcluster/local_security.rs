//! What the dev cluster gives a local user: the files it writes (the state file holds every
//! object, Secrets included; the kubeconfig holds the token) are its owner's only and are
//! written through no path another user could plant; only the exact token is accepted; token
//! and access reviews answer as the dev cluster's one user.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use wasmctrl_devcluster::{DevCluster, DevClusterConfig};

use super::{cluster, code};

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

/// What a planted file at `path` says afterwards.
fn planted(dir: &Path, link: &str) -> String {
    let victim = dir.join(format!("{link}.victim"));
    std::fs::write(&victim, "untouched").unwrap();
    symlink(&victim, dir.join(link)).unwrap();
    victim.display().to_string()
}

#[tokio::test]
async fn the_state_file_is_private_and_written_through_no_predictable_path() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    // Another local user plants a symlink where the old code wrote its temporary copy.
    let victim = planted(dir.path(), "state.tmp");
    let c = DevCluster::start(DevClusterConfig { state_file: Some(state.clone()), ..Default::default() })
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(c.client().unwrap(), "default");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "stringData": {"password": "hunter2"},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    c.save_state().unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched", "the planted link was not followed");
    assert_eq!(mode(&state), 0o600, "the state file (Secrets included) is its owner's only");
    assert!(std::fs::read_to_string(&state).unwrap().contains("password"));
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["state.json", "state.tmp", "state.tmp.victim"], "no temporary file is left behind");

    // Saved again over an existing state file made readable by others: private again.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o644)).unwrap();
    c.shutdown().await;
    assert_eq!(mode(&state), 0o600);
}

#[tokio::test]
async fn the_kubeconfig_is_private_from_its_first_byte_and_never_written_through_a_link() {
    let c = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/dev.kubeconfig");
    c.write_kubeconfig(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
    assert!(std::fs::read_to_string(&path).unwrap().contains(c.token()));

    // A link planted at the path is replaced, not written through.
    let victim = planted(dir.path(), "planted.kubeconfig");
    let link = dir.path().join("planted.kubeconfig");
    c.write_kubeconfig(&link).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
    assert!(!std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(mode(&link), 0o600);

    // An existing kubeconfig readable by others is replaced by a private one.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    c.write_kubeconfig(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
}

#[tokio::test]
async fn only_the_exact_token_is_accepted() {
    let c = cluster().await;
    let token = c.token().to_owned();
    for wrong in [&token[..token.len() - 1], &format!("{token}x"), "", &token.to_uppercase()] {
        let mut config = c.kube_config();
        config.auth_info.token = Some(wrong.to_owned().into());
        let api: Api<ConfigMap> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
        let (status, _) = code(api.list(&ListParams::default()).await.unwrap_err());
        assert_eq!(status, 401, "token {wrong:?}");
    }
    let api: Api<ConfigMap> = Api::namespaced(c.client().unwrap(), "default");
    api.list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn token_and_access_reviews_answer_as_the_one_user() {
    let c = cluster().await;
    let client = c.client().unwrap();
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review = |token: &str| -> TokenReview {
        serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token},
        }))
        .unwrap()
    };
    let status = reviews.create(&PostParams::default(), &review(c.token())).await.unwrap().status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    let user = status.user.unwrap();
    assert_eq!(user.username.as_deref(), Some("wasmctrl-dev-admin"));
    assert!(user.groups.unwrap().iter().any(|g| g == "system:masters"));
    let status =
        reviews.create(&PostParams::default(), &review("not-the-token")).await.unwrap().status.unwrap();
    assert_ne!(status.authenticated, Some(true));
    assert!(status.user.is_none());

    let access: Api<SubjectAccessReview> = Api::all(client);
    let sar = |groups: &[&str]| -> SubjectAccessReview {
        serde_json::from_value(json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "someone", "groups": groups, "nonResourceAttributes": {"path": "/metrics", "verb": "get"}},
        }))
        .unwrap()
    };
    let allowed = |r: SubjectAccessReview| r.status.unwrap().allowed;
    assert!(allowed(access.create(&PostParams::default(), &sar(&["system:masters"])).await.unwrap()));
    assert!(!allowed(access.create(&PostParams::default(), &sar(&["system:authenticated"])).await.unwrap()));
    // A body of another kind is refused.
    let wrong: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {},
    }))
    .unwrap();
    let raw = http::Request::post(format!("{}/apis/authentication.k8s.io/v1/tokenreviews", c.url()))
        .body(serde_json::to_vec(&wrong).unwrap())
        .unwrap();
    let response = c.client().unwrap().send(raw.map(Into::into)).await.unwrap();
    assert_eq!(response.status(), 400);
}
