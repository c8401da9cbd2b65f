//! Keeping the management host's state in etcd, and choosing which of several management
//! hosts leads, through etcd's v3 JSON gateway (plain HTTP/1.1; keys and values in base64).
//!
//! - **Leading.** A management host leads while it holds the key `PREFIX/leader`, written
//!   with a lease of [`LEASE_TTL`] only if the key does not exist (a transaction on its
//!   create revision), and kept alive every [`KEEPALIVE_EVERY`]. When the leader dies its
//!   lease runs out and a standby's next campaign (every [`CAMPAIGN_EVERY`]) wins.
//! - **Fencing.** Every state write is a transaction that succeeds only while
//!   `PREFIX/leader` still names this host under its lease: a leader that lost its lease (a
//!   pause, a partition) cannot overwrite what the new leader wrote; it learns it is deposed
//!   and stops serving.
//! - **The state** is kept as records under `PREFIX/state/`: one per node, region name and
//!   grant, and one of what is left (`meta`: the next id, retired ids). A change writes the
//!   records it changed (fenced as above), so no write grows with the state: etcd's limit on a
//!   request (1.5 MiB by default) bounds a record, not the whole (see the state module).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::MhError;

/// The lease a leader holds: how long after the leader's death a standby can take over.
pub const LEASE_TTL: Duration = Duration::from_secs(2);
/// How often a leader renews its lease.
pub const KEEPALIVE_EVERY: Duration = Duration::from_millis(400);
/// How often a standby tries to become the leader.
pub const CAMPAIGN_EVERY: Duration = Duration::from_millis(300);
/// Writes in one transaction, at most (etcd's `--max-txn-ops` is 128 by default).
pub const TXN_OPS_MAX: usize = 100;
/// Keys read in one range request (a record is at most a few tens of KiB: a page stays well
/// under the largest answer read).
pub const RANGE_PAGE_KEYS: usize = 128;
/// The longest answer read from etcd.
const RESPONSE_BYTES_MAX: usize = 8 << 20;
/// How long one request to etcd may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Where etcd is and under which prefix this fabric's keys live.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// Client endpoints, `host:port` (an `http://` in front is accepted).
    pub endpoints: Vec<String>,
    /// Key prefix, e.g. `/rackwire/FABRIC`.
    pub prefix: String,
}

impl EtcdConfig {
    /// From a comma-separated list of endpoints and a fabric name.
    pub fn new(endpoints: &str, fabric: &str) -> Result<Self, MhError> {
        let endpoints: Vec<String> = endpoints
            .split(',')
            .map(|e| e.trim().trim_start_matches("http://").trim_end_matches('/').to_string())
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(MhError::Config("no etcd endpoint given".into()));
        }
        crate::check_name(fabric)?;
        Ok(EtcdConfig { endpoints, prefix: format!("/rackwire/{fabric}") })
    }
}

/// A client of etcd's JSON gateway.
#[derive(Debug, Clone)]
pub struct Etcd {
    cfg: EtcdConfig,
}

fn b64(s: &[u8]) -> String {
    B64.encode(s)
}

/// One HTTP/1.1 POST of a JSON body; the JSON answer.
fn post(endpoint: &str, path: &str, body: &Value) -> Result<Value, String> {
    let addr = endpoint.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("no address")?;
    let mut s = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.take(RESPONSE_BYTES_MAX as u64 + 1).read_to_end(&mut raw).map_err(|e| e.to_string())?;
    if raw.len() > RESPONSE_BYTES_MAX {
        return Err("answer too large".into());
    }
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    let mut payload = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        payload = dechunk(&payload).ok_or("bad chunked encoding")?;
    }
    if status != "200" {
        return Err(format!("etcd answered {status}: {}", String::from_utf8_lossy(&payload)));
    }
    serde_json::from_slice(&payload).map_err(|e| format!("etcd's answer is not JSON: {e}"))
}

/// The body of a chunked transfer.
fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&b[..eol]).ok()?.split(';').next()?.trim(), 16).ok()?;
        b = &b[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

/// A number etcd sends as a string (64-bit values in JSON).
fn num(v: &Value) -> i64 {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_i64()).unwrap_or(0)
}

impl Etcd {
    /// A client for `cfg`.
    pub fn new(cfg: EtcdConfig) -> Self {
        Etcd { cfg }
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.cfg.prefix)
    }

    /// POST to the first endpoint that answers.
    fn call(&self, path: &str, body: Value) -> Result<Value, MhError> {
        let mut last = String::new();
        for e in &self.cfg.endpoints {
            match post(e, path, &body) {
                Ok(v) => return Ok(v),
                Err(why) => last = format!("{e}: {why}"),
            }
        }
        Err(MhError::Unavailable(format!("etcd: {last}")))
    }

    /// A new lease of [`LEASE_TTL`].
    pub fn grant(&self) -> Result<i64, MhError> {
        let v = self.call("/v3/lease/grant", json!({ "TTL": LEASE_TTL.as_secs() }))?;
        match num(&v["ID"]) {
            0 => Err(MhError::Protocol(format!("etcd granted no lease: {v}"))),
            id => Ok(id),
        }
    }

    /// Renew `lease`: false when it is gone (it ran out).
    pub fn keepalive(&self, lease: i64) -> Result<bool, MhError> {
        let v = self.call("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))?;
        Ok(num(&v["result"]["TTL"]) > 0)
    }

    /// Give `lease` up now (its keys go with it).
    pub fn revoke(&self, lease: i64) -> Result<(), MhError> {
        self.call("/v3/lease/revoke", json!({ "ID": lease.to_string() })).map(drop)
    }

    /// Take the leader key for `me` under `lease` if nobody holds it. True when taken.
    pub fn campaign(&self, me: &str, lease: i64) -> Result<bool, MhError> {
        let key = b64(self.key("leader").as_bytes());
        let v = self.call(
            "/v3/kv/txn",
            json!({
                "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
                "success": [{ "request_put": { "key": key, "value": b64(me.as_bytes()), "lease": lease.to_string() } }],
                "failure": [],
            }),
        )?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }

    /// Who leads (the leader key's value), if anyone.
    pub fn leader(&self) -> Result<Option<String>, MhError> {
        Ok(self.get("leader")?.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// The value of `PREFIX/name`.
    pub fn get(&self, name: &str) -> Result<Option<Vec<u8>>, MhError> {
        let v = self.call("/v3/kv/range", json!({ "key": b64(self.key(name).as_bytes()) }))?;
        match v["kvs"].get(0) {
            None => Ok(None),
            Some(kv) => B64
                .decode(kv["value"].as_str().unwrap_or(""))
                .map(Some)
                .map_err(|e| MhError::Protocol(format!("etcd value is not base64: {e}"))),
        }
    }

    /// Every key under `PREFIX/name_prefix` with its value (names relative to `PREFIX/`),
    /// read a page at a time ([`RANGE_PAGE_KEYS`] keys).
    pub fn get_prefix(&self, name_prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MhError> {
        let start = self.key(name_prefix);
        // The end of the range: the prefix with its last byte one higher.
        let mut end = start.clone().into_bytes();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let strip = format!("{}/", self.cfg.prefix);
        let (mut out, mut from) = (Vec::new(), start.clone().into_bytes());
        loop {
            let v = self.call(
                "/v3/kv/range",
                json!({ "key": b64(&from), "range_end": b64(&end), "limit": RANGE_PAGE_KEYS.to_string() }),
            )?;
            let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
            for kv in &kvs {
                let key = B64.decode(kv["key"].as_str().unwrap_or("")).map_err(|e| MhError::Protocol(e.to_string()))?;
                let value =
                    B64.decode(kv["value"].as_str().unwrap_or("")).map_err(|e| MhError::Protocol(e.to_string()))?;
                let name = String::from_utf8_lossy(&key).strip_prefix(&strip).unwrap_or_default().to_string();
                out.push((name, value));
                from = [key.as_slice(), &[0]].concat();
            }
            if !v["more"].as_bool().unwrap_or(false) || kvs.is_empty() {
                return Ok(out);
            }
        }
    }

    /// Write `puts` and delete `deletes` (names under `PREFIX/`) in one transaction, if `me`
    /// still holds the leader key under `lease`; at most [`TXN_OPS_MAX`] at once. False when
    /// it does not lead: nothing was written.
    pub fn txn_if_leader(
        &self,
        me: &str,
        lease: i64,
        puts: &[(String, Vec<u8>)],
        deletes: &[String],
    ) -> Result<bool, MhError> {
        if puts.len() + deletes.len() > TXN_OPS_MAX {
            return Err(MhError::Protocol(format!("more than {TXN_OPS_MAX} writes in one transaction")));
        }
        let leader = b64(self.key("leader").as_bytes());
        let mut ops: Vec<Value> = puts
            .iter()
            .map(|(k, v)| json!({ "request_put": { "key": b64(self.key(k).as_bytes()), "value": b64(v) } }))
            .collect();
        ops.extend(deletes.iter().map(|k| json!({ "request_delete_range": { "key": b64(self.key(k).as_bytes()) } })));
        let v = self.call(
            "/v3/kv/txn",
            json!({
                "compare": [
                    { "key": leader, "target": "VALUE", "result": "EQUAL", "value": b64(me.as_bytes()) },
                    { "key": leader, "target": "LEASE", "result": "EQUAL", "lease": lease.to_string() },
                ],
                "success": ops,
                "failure": [],
            }),
        )?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the chunked-transfer decoder on two chunks with an extension, and that a
    // truncated body is refused rather than misread.
    #[test]
    fn dechunks() {
        assert_eq!(dechunk(b"3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n").unwrap(), b"abcde");
        assert!(dechunk(b"5\r\nab").is_none());
    }

    // Checks endpoint parsing: schemes and slashes dropped, empty entries ignored, none at all
    // refused; the prefix carries the fabric's name.
    #[test]
    fn endpoints_parse() {
        let c = EtcdConfig::new("http://127.0.0.1:2379/, 198.18.0.2:2379,", "f1").unwrap();
        assert_eq!(c.endpoints, vec!["127.0.0.1:2379", "198.18.0.2:2379"]);
        assert_eq!(c.prefix, "/rackwire/f1");
        assert!(EtcdConfig::new(" , ", "f1").is_err());
    }
}
