//! One refusal type, carried into errors with its details on both transports.

use rackwire::{Access, Error, Fabric, ManagementHost, OpFlags};

const SECRET: &str = "refusal-test-secret-0123456789ab";

fn node(mh: &rackwire::MhHandle, name: &str, edge: bool) -> Fabric {
    rackwire_tests::thread_node(mh, SECRET, name, edge)
}

// Checks, on the shared-memory and on the edge transport alike, that a refused operation's
// error keeps what the refusal knew: an out-of-bounds write names the region's real length
// (the edge transport used to report 0), a write without a grant names the access it
// needed, an atomic without atomic rights likewise; and the target's bytes stay unchanged.
#[test]
fn refusals_keep_their_details_on_both_transports() {
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    for edge in [false, true] {
        let tag = if edge { "edge" } else { "shm" };
        let owner = node(&mh, &format!("ref-owner-{tag}"), edge);
        let user = node(&mh, &format!("ref-user-{tag}"), edge);
        let region = owner.alloc(4096, Access::READ | Access::WRITE | Access::ATOMIC).unwrap();
        region.grant(user.id(), Access::WRITE).unwrap();
        let conn = user.connect(owner.id()).unwrap();
        let h = region.handle();
        // The handle says 4096 bytes, so an initiator checks what it can before sending: a
        // handle claiming more makes the target the one to refuse.
        let wide = rackwire::RemoteRegion::from_parts(h.node(), h.region(), h.key(), 1 << 20);
        let e = conn.write(&wide, 8000, b"past the end", OpFlags::NONE).wait().unwrap_err();
        assert!(
            matches!(e, Error::OutOfBounds { offset: 8000, len: 12, region_len: 4096, .. }),
            "{tag}: out of bounds: {e:?}"
        );
        let e = conn.fetch_add(&h, 0, 1, OpFlags::NONE).wait().unwrap_err();
        assert!(matches!(e, Error::Ungranted { needed, .. } if needed == Access::ATOMIC), "{tag}: atomic: {e:?}");
        region.revoke(user.id()).unwrap();
        region.grant(user.id(), Access::READ).unwrap();
        let e = conn.write(&h, 0, b"no", OpFlags::NONE).wait().unwrap_err();
        assert!(matches!(e, Error::Ungranted { needed, .. } if needed.contains(Access::WRITE)), "{tag}: write: {e:?}");
        assert_eq!(region.to_vec(0, 8).unwrap(), vec![0u8; 8], "{tag}: the target's bytes changed");
    }
}
