//! Messages of the management-host protocol (newline-delimited JSON).

use serde::{Deserialize, Serialize};

/// A node's id in the fabric, given by the management host, stable across restarts by name.
pub type NodeId = u32;

/// How to reach a node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Node id.
    pub id: NodeId,
    /// Unique name.
    pub name: String,
    /// Identity of the machine whose memory the node can share (the kernel's boot id): nodes
    /// with equal `host` reach each other through shared memory.
    pub host: String,
    /// Path of the node's shared-memory control endpoint.
    pub shm_path: Option<String>,
    /// Addresses of the node's Ethernet links, for the edge transport.
    pub links: Vec<String>,
    /// Process id, for operators.
    pub pid: u32,
    /// The node's public key, hex (bound to its id and name at first admission; peers check
    /// handshake signatures against it). Set by the management host, never by the node.
    #[serde(default)]
    pub key: String,
    /// A node with no name of its own, forgotten soon after it leaves (set by the management
    /// host from the node's admission, never by the node's records).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transient: bool,
}

/// A node as the management host sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// What the node registered.
    pub info: NodeInfo,
    /// Whether it has a live session with heartbeats.
    pub up: bool,
    /// When it was last heard from (milliseconds since the Unix epoch; 0: never since start).
    pub last_seen_ms: u64,
    /// Down because its side closed its session (it left, or its process ended), not because
    /// it went silent (which a partition also causes): its peers may take it as gone.
    #[serde(default)]
    pub ended: bool,
}

/// A published region: a name for a remote-region handle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionEntry {
    /// Published name.
    pub name: String,
    /// Owner node.
    pub node: NodeId,
    /// Region id at the owner.
    pub region: u32,
    /// The region's key, 32 hex digits.
    pub key: String,
    /// Length in bytes.
    pub len: u64,
}

/// A grant recorded centrally (the owner decides and enforces; the MH keeps the record).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantEntry {
    /// Owner node.
    pub node: NodeId,
    /// Region id at the owner.
    pub region: u32,
    /// The peer allowed in.
    pub peer: NodeId,
    /// Access bits (1 read, 2 write, 4 atomic).
    pub access: u8,
}

/// One rank of a job as a round sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMember {
    /// The node that is this rank.
    pub node: NodeId,
    /// What it posted in the round, hex; `None` while it has not.
    pub blob: Option<String>,
}

/// One bootstrap round of a job: what each rank posted so far.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRound {
    /// Ranks in the job.
    pub size: u32,
    /// By rank; `None` for a rank that has not joined yet. In a page of a round, from rank
    /// `first` on (the client puts the pages together: whole, `first` is 0).
    pub members: Vec<Option<JobMember>>,
    /// The rank of `members[0]`.
    #[serde(default)]
    pub first: u32,
    /// Ranks whose node is down (the job cannot go on).
    pub down: Vec<u32>,
}

impl JobRound {
    /// The page of this round from rank `from` on: as many members as fit
    /// [`crate::REPLY_PAGE_BYTES`] (at least one while any is left).
    pub fn page_from(mut self, from: u32) -> JobRound {
        let from = (from as usize).min(self.members.len());
        let mut bytes = 0;
        let mut end = from;
        while end < self.members.len() && (end == from || bytes < crate::REPLY_PAGE_BYTES) {
            bytes += serde_json::to_vec(&self.members[end]).map_or(0, |v| v.len()) + 1;
            end += 1;
        }
        self.members.truncate(end);
        self.members.drain(..from);
        self.first = from as u32;
        self
    }
}

/// What a client says first.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Hello {
    /// Node name (observers: any label).
    pub name: String,
    /// `node` or `observer`.
    pub role: String,
    /// Client nonce, hex.
    pub nonce: String,
    /// A node's public key, hex (observers: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The client's ephemeral X25519 key for the session's authenticated lines, hex.
    pub ephemeral: String,
    /// The client's message of the exchange over the fabric secret
    /// ([`crate::auth::Pake`], the client speaking first), hex.
    pub pake: String,
    /// A node coming back: the id it had (kept if the management host, having lost its state,
    /// has no record of the name, and the id is not retired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_id: Option<NodeId>,
    /// A node with no name of its own (a job's process): its key pair lives in its memory
    /// only, so once it leaves no one can come back as it, and the management host forgets
    /// it soon after (see the `departed` module).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transient: bool,
}

/// The server's answer to [`Hello`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Challenge {
    /// Server nonce, hex.
    pub nonce: String,
    /// The server's confirmation of the exchange's key over [`admission_transcript`], hex.
    pub proof: String,
    /// The server's ephemeral X25519 key, hex.
    pub ephemeral: String,
    /// The server's message of the exchange over the fabric secret, hex.
    pub pake: String,
    /// The management host's public key, hex: nodes pin it (see [`crate::MhTrust`]).
    pub host_key: String,
    /// The host key's signature of [`host_signed`] of the admission transcript, hex.
    pub host_signature: String,
}

/// What a management host signs with its key at an admission: the transcript, labelled.
pub fn host_signed(transcript: &[u8]) -> Vec<u8> {
    [b"rackwire-mh-host\0".as_slice(), transcript].concat()
}

/// What names an admission's exchange over the secret (both ends give the same).
pub fn admission_context(name: &str) -> Vec<u8> {
    format!("rackwire-mh admission {name}").into_bytes()
}

/// Labels of the server's and the client's confirmations.
pub const CONFIRM_SERVER: &str = "rackwire-mh-server";
/// See [`CONFIRM_SERVER`].
pub const CONFIRM_CLIENT: &str = "rackwire-mh-client";

/// What both ends of an admission confirm under the key of their exchange: everything either
/// said before the confirmations (names, nonces, keys, exchange messages).
pub fn admission_transcript(hello: &Hello, ch: &Challenge) -> Vec<u8> {
    let prev_id = hello.prev_id.map(|p| p.to_string()).unwrap_or_default();
    let transient = if hello.transient { "transient" } else { "" };
    let fields = [
        hello.name.as_str(),
        &hello.role,
        &hello.nonce,
        hello.key.as_deref().unwrap_or(""),
        &hello.ephemeral,
        &hello.pake,
        &prev_id,
        transient,
        &ch.nonce,
        &ch.ephemeral,
        &ch.pake,
        &ch.host_key,
    ];
    let mut t = b"rackwire-mh-admission-v4".to_vec();
    for f in fields {
        t.extend_from_slice(&(f.len() as u32).to_be_bytes());
        t.extend_from_slice(f.as_bytes());
    }
    t
}

/// The client's confirmation of the exchange's key, hex.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Proof {
    /// Hex confirmation over [`admission_transcript`].
    pub proof: String,
    /// A node's signature, hex, with the key it named, of the server nonce, its name and key
    /// (observers: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// The outcome of admission.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Admission {
    /// Admitted; observers get id 0.
    Welcome {
        /// The node's id.
        node_id: NodeId,
    },
    /// Refused, with why.
    Denied {
        /// Reason.
        reason: String,
    },
}

/// Requests after admission.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Request {
    /// Record how to reach this node.
    Register {
        /// The node's info (id and name are taken from the session, not from here).
        info: NodeInfo,
    },
    /// I am alive.
    Heartbeat,
    /// The nodes, a page at a time (see [`crate::REPLY_PAGE_BYTES`]).
    Nodes {
        /// Nodes with ids past this one (the first page: none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<NodeId>,
    },
    /// One node by id.
    Resolve {
        /// Node id.
        node: NodeId,
    },
    /// One node by name.
    ResolveName {
        /// Name.
        name: String,
    },
    /// Publish a region of this node under a name.
    Publish {
        /// The entry (its `node` must be the session's).
        entry: RegionEntry,
    },
    /// Remove a name this node published.
    Unpublish {
        /// Name.
        name: String,
    },
    /// Find a region by name.
    Lookup {
        /// Name.
        name: String,
    },
    /// The published regions and grants, a page at a time.
    Regions {
        /// Regions whose names come after this one (the first page: none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after_name: Option<String>,
        /// Grants from this position on.
        #[serde(default)]
        from_grant: usize,
    },
    /// Record a grant of this node's region.
    Grant {
        /// The grant (its `node` must be the session's).
        grant: GrantEntry,
    },
    /// Remove a grant record.
    Revoke {
        /// Region id.
        region: u32,
        /// Peer.
        peer: NodeId,
    },
    /// Forget every grant and name of one of this node's regions (it was freed).
    DropRegion {
        /// Region id.
        region: u32,
    },
    /// Post this node's blob, as `rank` of `job`, in bootstrap round `round`.
    JobPost {
        /// Job name.
        job: String,
        /// The job's token, when its launcher handed its ranks one: the job is then reachable
        /// only with it (see [`crate::jobs`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// Ranks in the job.
        size: u32,
        /// This node's rank.
        rank: u32,
        /// Round number (0 joins).
        round: u64,
        /// The blob, hex.
        blob: String,
    },
    /// What a round of a job holds so far.
    JobRound {
        /// Job name.
        job: String,
        /// The job's token, if it has one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        /// Round number.
        round: u64,
        /// The first rank whose member the reply holds (a page at a time).
        #[serde(default)]
        from_rank: u32,
    },
}

/// Replies.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "reply")]
pub enum Reply {
    /// Done.
    Ok,
    /// A failure with its kind (`not_found`, `refused`).
    Error {
        /// Kind.
        kind: String,
        /// Message.
        message: String,
    },
    /// One node.
    Node {
        /// Its info.
        info: NodeInfo,
    },
    /// A page of nodes.
    Nodes {
        /// Their status.
        nodes: Vec<NodeStatus>,
        /// More follow, past this id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        more_after: Option<NodeId>,
        /// The management host's clock when it answered (milliseconds since the Unix epoch;
        /// none from a host that predates it), for a node to see how far its own is off.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        now_ms: Option<u64>,
    },
    /// One region.
    Region {
        /// The entry.
        entry: RegionEntry,
    },
    /// The directory.
    Regions {
        /// Published regions.
        regions: Vec<RegionEntry>,
        /// Recorded grants.
        grants: Vec<GrantEntry>,
        /// More regions follow, past this name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        more_after_name: Option<String>,
        /// More grants follow, from this position.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        more_from_grant: Option<usize>,
    },
    /// One round of a job.
    Job {
        /// The round.
        round: JobRound,
    },
}
