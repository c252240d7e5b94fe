//! Runs a dev cluster until Ctrl-C, writing its kubeconfig to the path given as the first
//! argument (default `dev-cluster.kubeconfig`). Optional second argument: `http` for plain HTTP.

use wasmctrl_devcluster::{DevCluster, DevClusterConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "dev-cluster.kubeconfig".into());
    let tls = args.next().as_deref() != Some("http");
    let cluster = DevCluster::start(DevClusterConfig { tls, ..Default::default() }).await?;
    cluster.write_kubeconfig(&path)?;
    println!("dev cluster at {} (kubeconfig: {path})", cluster.url());
    cluster
        .run_until(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
