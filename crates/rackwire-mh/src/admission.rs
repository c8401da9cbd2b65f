//! Admission: how a client becomes a session of the management host — hello, the host's
//! challenge (its proof of the secret and its key's signature), the client's proof (and, for a
//! node, its key's signature), then welcome or denied; the node's id found, given back or made.

use std::io::BufRead;
use std::net::TcpStream;

use tracing::{info, warn};

use crate::auth::{self, from_hex, to_hex};
use crate::channel::{Channel, Ephemeral};
use crate::identity;
use crate::line::{now_ms, read_line_max, write_json};
use crate::proto;
use crate::proto::*;
use crate::sessions::ADMISSION_LINE_BYTES_MAX;
use crate::shared::{io_err, lock, parse, Live, Shared};
use crate::{check_name, MhError, NODES_MAX};

/// Admission: hello → challenge (with our proof) → client proof → welcome / denied.
pub(crate) fn admit(
    shared: &Shared,
    r: &mut impl BufRead,
    w: &mut TcpStream,
    session: u64,
) -> Result<(NodeId, String, Channel), MhError> {
    let mut line = String::new();
    let read_line = |r: &mut _, line: &mut String| read_line_max(r, line, ADMISSION_LINE_BYTES_MAX);
    read_line(r, &mut line).map_err(io_err)?.ok_or_else(|| MhError::Protocol("closed before hello".into()))?;
    let hello: Hello = parse(&line)?;
    let client_nonce = from_hex(&hello.nonce)
        .filter(|n| n.len() == auth::NONCE_BYTES)
        .ok_or_else(|| MhError::Protocol("bad nonce".into()))?;
    let server_nonce = auth::nonce();
    // The exchange over the secret: this side proves nothing anyone could test a guess of the
    // secret against (see `auth::Pake`).
    let (pake, server_pake) = auth::Pake::start(&shared.secret, false, &proto::admission_context(&hello.name));
    let key = from_hex(&hello.pake)
        .and_then(|m| pake.finish(&m))
        .ok_or_else(|| MhError::Protocol("a malformed exchange message".into()))?;
    let eph = Ephemeral::generate();
    let ephemerals = [hello.ephemeral.clone(), eph.public.clone()];
    let mut challenge = Challenge {
        nonce: to_hex(&server_nonce),
        proof: String::new(),
        ephemeral: eph.public.clone(),
        pake: to_hex(&server_pake),
        host_key: to_hex(&shared.host_key.public()),
        host_signature: String::new(),
    };
    let transcript = proto::admission_transcript(&hello, &challenge);
    challenge.proof = to_hex(&key.confirm(proto::CONFIRM_SERVER, &transcript));
    challenge.host_signature = to_hex(&shared.host_key.sign(&proto::host_signed(&transcript)));
    write_json(w, &challenge).map_err(io_err)?;
    // From here the client can test a guess of the secret against our proof (one, online):
    // a connection that then does not prove the secret counts as a wrong guess of its source.
    let guessed = || {
        if let Ok(from) = w.peer_addr() {
            lock(&shared.sessions).wrong_secret(from.ip());
        }
    };
    let proof_line = read_line(r, &mut line).map_err(io_err).and_then(|l| {
        l.ok_or_else(|| MhError::Protocol("closed before proof".into()))?;
        parse::<Proof>(&line)
    });
    let client_proof = match proof_line {
        Ok(p) => p,
        Err(e) => {
            guessed();
            return Err(e);
        }
    };
    let ok = from_hex(&client_proof.proof).is_some_and(|p| key.check(proto::CONFIRM_CLIENT, &transcript, &p));
    let count = |outcome: &'static str| *lock(&shared.admissions).entry(outcome).or_insert(0) += 1;
    let deny = |w: &mut TcpStream, reason: &str| {
        count("refused");
        let _ = write_json(w, &Admission::Denied { reason: reason.into() });
        Err(MhError::Denied(reason.into()))
    };
    if !ok {
        warn!(name = %hello.name, "admission refused: wrong secret");
        guessed();
        return deny(w, "wrong secret");
    }
    let Ok(channel) = eph.channel(&hello.ephemeral, &shared.secret, &client_nonce, &server_nonce, false) else {
        return deny(w, "a bad ephemeral key");
    };
    let id = match hello.role.as_str() {
        "observer" => 0,
        "node" => {
            if let Err(e) = check_name(&hello.name) {
                return deny(w, &e.to_string());
            }
            // The node proves it holds the private half of the key it names.
            let Some(key) = hello.key.as_deref().and_then(identity::public_from_hex) else {
                return deny(w, "a node must name its public key");
            };
            let signed = client_proof.signature.as_deref().and_then(from_hex).is_some_and(|sig| {
                let [c, s] = &ephemerals;
                identity::verify(
                    &key,
                    &crate::client::admission_message(&server_nonce, &hello.name, &key, [c, s]),
                    &sig,
                )
            });
            if !signed {
                warn!(name = %hello.name, "admission refused: the key's signature does not hold");
                return deny(w, "the signature does not match the key named");
            }
            let key_hex = to_hex(&key);
            // A full table makes room by forgetting the node down longest, if down long enough.
            if lock(&shared.store).state.nodes.len() >= NODES_MAX {
                crate::forgetting::make_room(shared);
            }
            let mut store = lock(&shared.store);
            let existing = store.state.nodes.values().find(|n| n.name == hello.name).map(|n| (n.id, n.key.clone()));
            let mut live = lock(&shared.live);
            let id = match existing {
                // A name is bound to the key it was first admitted with, whether or not its
                // node is up: another key never gets its id (and with it the node's grants).
                Some((_, bound)) if !bound.is_empty() && bound != key_hex => {
                    drop(live);
                    drop(store);
                    warn!(name = %hello.name, "admission refused: the name is bound to another key");
                    return deny(w, &format!("name {} is bound to another node's key", hello.name));
                }
                Some((id, _)) if live.contains_key(&id) => {
                    drop(live);
                    drop(store);
                    return deny(w, &format!("name {} is in use by a live node", hello.name));
                }
                Some((id, bound)) => {
                    if bound.is_empty() {
                        // Recorded before names were bound to keys: bind it now.
                        if let Some(n) = store.state.nodes.get_mut(&id) {
                            n.key = key_hex;
                        }
                        store.save()?;
                    }
                    id
                }
                None => {
                    if store.state.nodes.len() >= NODES_MAX {
                        drop(live);
                        drop(store);
                        return deny(w, "node limit reached");
                    }
                    // A node coming back to a management host that lost its state keeps the
                    // id it had (so the grants, handles and connections that name it hold),
                    // unless the id is on record or retired. Otherwise: ids only grow and are
                    // never handed out twice; past the last one, no more nodes (a state that
                    // says otherwise was tampered with).
                    let returning = hello.prev_id.filter(|&p| store.state.may_return_as(p) && !live.contains_key(&p));
                    let id = returning.unwrap_or(store.state.next_id);
                    let Some(next) = id.checked_add(1) else {
                        drop(live);
                        drop(store);
                        return deny(w, "node ids exhausted (the next id in the state is the last one)");
                    };
                    store.state.next_id = store.state.next_id.max(next);
                    if returning.is_some() {
                        info!(name = %hello.name, id, "a node came back with the id it had (the state had none for it)");
                    }
                    let info = NodeInfo {
                        id,
                        name: hello.name.clone(),
                        key: key_hex,
                        transient: hello.transient,
                        ..NodeInfo::default()
                    };
                    store.state.nodes.insert(id, info);
                    store.save()?;
                    id
                }
            };
            let from = w.peer_addr().ok().map(|a| a.ip());
            live.insert(id, Live { session, last_seen_ms: now_ms(), from });
            lock(&shared.ended).remove(&id);
            lock(&shared.departed).up(id, hello.transient);
            id
        }
        other => return deny(w, &format!("unknown role {other:?}")),
    };
    write_json(w, &Admission::Welcome { node_id: id }).map_err(io_err)?;
    count("admitted");
    info!(name = %hello.name, id, "admitted");
    Ok((id, hello.name, channel))
}
