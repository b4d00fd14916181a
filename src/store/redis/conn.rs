//! Where Redis is, and the connection the store's task talks to it on.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, RedisResult, ScriptInvocation, Value};
use tokio::time::timeout;

use super::StoreError;

/// Where Redis is.
pub(crate) enum Backend {
    Single(redis::Client),
    /// A Cluster, given some of its nodes.
    Cluster {
        urls: Vec<String>,
        client: Box<ClusterClient>,
    },
}

impl Backend {
    pub(crate) fn new(
        urls: &[String],
        cluster: bool,
        timeout: Duration,
    ) -> Result<Self, StoreError> {
        let first = urls.first().map(String::as_str).unwrap_or_default();
        let client = redis::Client::open(first).map_err(|e| bad_url(first, e))?;
        if !cluster {
            return Ok(Backend::Single(client));
        }
        for url in urls {
            redis::Client::open(url.as_str()).map_err(|e| bad_url(url, e))?;
        }
        let cluster = ClusterClient::builder(urls.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(1)
            .build()
            .map_err(|e| bad_url(first, e))?;
        Ok(Backend::Cluster {
            urls: urls.to_vec(),
            client: Box::new(cluster),
        })
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Backend::Cluster { .. })
    }

    pub(crate) async fn connect(&self, limit: Duration) -> RedisResult<Conn> {
        let attempt = async {
            match self {
                Backend::Single(client) => {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(limit)
                        .set_response_timeout(limit)
                        .set_number_of_retries(1);
                    client
                        .get_connection_manager_with_config(config)
                        .await
                        .map(Conn::Single)
                }
                Backend::Cluster { client, .. } => client
                    .get_async_connection()
                    .await
                    .map(|c| Conn::Cluster(Box::new(c))),
            }
        };
        match timeout(limit, attempt).await {
            Ok(result) => result,
            Err(_) => Err(timed_out()),
        }
    }
}

fn bad_url(url: &str, e: RedisError) -> StoreError {
    StoreError::Url {
        url: url.to_owned(),
        reason: e.to_string(),
    }
}

pub(crate) fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "Redis did not answer in time",
    ))
}

pub(crate) fn garbage(what: &str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::TypeError,
        "unexpected answer from Redis",
        what.to_owned(),
    ))
}

/// A connection that reconnects by itself; clones share it.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    pub(crate) async fn invoke(&mut self, call: &ScriptInvocation<'_>) -> RedisResult<Value> {
        match self {
            Conn::Single(c) => call.invoke_async(c).await,
            Conn::Cluster(c) => call.invoke_async(c.as_mut()).await,
        }
    }

    /// `GET` of `key`, on the node holding it.
    pub(crate) async fn get(&mut self, key: &str) -> RedisResult<Value> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c.as_mut()).await,
        }
    }

    /// `MGET` of `keys` (on a Cluster, split by slot and put back in
    /// order by redis-rs).
    pub(crate) async fn mget(&mut self, keys: &[&str]) -> RedisResult<Vec<Value>> {
        let mut cmd = redis::cmd("MGET");
        cmd.arg(keys);
        let value: Value = match self {
            Conn::Single(c) => cmd.query_async(c).await?,
            Conn::Cluster(c) => cmd.query_async(c.as_mut()).await?,
        };
        match value {
            Value::Array(values) if values.len() == keys.len() => Ok(values),
            other => Err(garbage(&format!("{other:?}"))),
        }
    }
}
