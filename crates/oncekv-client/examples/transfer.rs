//! A bank-style transfer counter that survives a leader kill.
//!
//! Each transfer moves one unit from `account/a` to `account/b` as two
//! exactly-once INCRs on a session. Kill the leader while it runs (for
//! example `kill -9` one of three `oncekv serve` processes): retries go to
//! the new leader and are answered from completion records, so no transfer
//! is applied twice and the sum of both accounts stays 0.
//!
//! Run: `cargo run -p oncekv-client --example transfer -- 127.0.0.1:7379,127.0.0.1:7381,127.0.0.1:7383 1000`

use oncekv_client::{Client, ClientOptions, Command, Query, Reply, SessionOptions};
use std::time::Duration;

fn counter(reply: Reply) -> i64 {
    match reply {
        Reply::Get { value: Some(value) } => String::from_utf8_lossy(&value).parse().unwrap_or(0),
        _ => 0,
    }
}

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
    let options = ClientOptions {
        deadline: Duration::from_secs(60),
        ..ClientOptions::default()
    };
    let client = Client::connect(endpoints, options)?;
    let session = client.open_session(SessionOptions::default()).await?;
    for i in 1..=transfers {
        session
            .execute(Command::Incr {
                key: b"account/a".to_vec(),
                by: -1,
            })
            .await?;
        session
            .execute(Command::Incr {
                key: b"account/b".to_vec(),
                by: 1,
            })
            .await?;
        if i % 100 == 0 {
            println!("{i} transfers");
        }
    }
    let a = counter(
        client
            .read(
                Query::Get {
                    key: b"account/a".to_vec(),
                },
                false,
            )
            .await?,
    );
    let b = counter(
        client
            .read(
                Query::Get {
                    key: b"account/b".to_vec(),
                },
                false,
            )
            .await?,
    );
    println!("account/a = {a}, account/b = {b}, sum = {}", a + b);
    session.close().await?;
    if a + b != 0 {
        return Err("money was created or destroyed".into());
    }
    Ok(())
}
