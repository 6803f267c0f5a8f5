//! Bank-style transfers that survive a leader kill.
//!
//! Each transfer moves one unit from `account/a` to `account/b` as one
//! transaction on a session: both accounts change at one revision, or
//! neither does. Kill the leader while it runs (for example `kill -9` one
//! of three `oncekv serve` processes): retries go to the new leader and are
//! answered from completion records, so no transfer is applied twice, none
//! is half applied, and the sum of both accounts stays 0.
//!
//! Run: `cargo run -p oncekv-client --example transfer -- 127.0.0.1:7379,127.0.0.1:7381,127.0.0.1:7383 1000`

use oncekv_client::{Client, ClientOptions, Reply, SessionOptions, Txn, TxnOp};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoints: Vec<String> = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:7379".into())
        .split(',')
        .map(String::from)
        .collect();
    let transfers: i64 = args.next().map(|n| n.parse()).transpose()?.unwrap_or(100);
    let options = ClientOptions::default().with_deadline(Duration::from_secs(60));
    let client = Client::connect(endpoints, options)?;
    let session = client.open_session(SessionOptions::default()).await?;
    let before = balance(&client).await?;
    for i in 1..=transfers {
        let transfer = Txn::new()
            .on_success(TxnOp::incr("account/a", -1))
            .on_success(TxnOp::incr("account/b", 1));
        session.txn(transfer).await?;
        if i % 100 == 0 {
            println!("{i} transfers");
        }
    }
    let after = balance(&client).await?;
    println!("sum before = {before}, sum after = {after}");
    session.close().await?;
    if before != after {
        return Err("money was created or destroyed".into());
    }
    Ok(())
}

/// The sum of both accounts, read together by one transaction.
async fn balance(client: &Client) -> Result<i64, Box<dyn std::error::Error>> {
    let read = Txn::new()
        .on_success(TxnOp::get("account/a"))
        .on_success(TxnOp::get("account/b"));
    let mut sum = 0;
    for result in client.txn(read).await?.results {
        if let Reply::Get {
            value: Some(value), ..
        } = result
        {
            sum += String::from_utf8_lossy(&value).parse::<i64>()?;
        }
    }
    Ok(sum)
}
