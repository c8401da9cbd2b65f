//! The Debian package as a host gets it: built by `scripts/package-deb.sh` from this build,
//! unpacked (`dpkg -x`), and run on two "hosts" — network namespaces joined by one rail, each
//! command in a mount namespace of its own where the host's folder is `/etc/rackwire` and
//! `/var/lib/rackwire`, so every program finds the host's file where a real host keeps it. The
//! services' commands run as their units say (ExecStart, Environment, the credential). Root
//! only: elsewhere the test says it is skipped and passes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rackwire_tests::{succeeded as ok, TempDir};

const SECRET: &str = "package-test-secret-0123456789";
/// The hosts' rail addresses (one rail, a /24 of 198.18.0.0/15).
const HOSTS: [(&str, &str); 2] = [("rwpkg-a", "198.18.61.1"), ("rwpkg-b", "198.18.61.2")];
/// How long the hosts' services may take to come up and meet.
const UP_WAIT: Duration = Duration::from_secs(30);

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

fn have(prog: &str, arg: &str) -> bool {
    Command::new(prog).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run a command")
}

/// The two hosts' namespaces and rail, and the mount points made for them: all removed when
/// the test ends, also when it fails.
struct Hosts {
    made_dirs: Vec<PathBuf>,
    children: Vec<Child>,
}

impl Hosts {
    fn up() -> Hosts {
        let mut h = Hosts { made_dirs: Vec::new(), children: Vec::new() };
        for (ns, _) in HOSTS {
            let _ = run(Command::new("ip").args(["netns", "del", ns]));
            ok(&run(Command::new("ip").args(["netns", "add", ns])));
        }
        ok(&run(Command::new("ip").args(["link", "add", "rwpkg0", "type", "veth", "peer", "name", "rwpkg1"])));
        for (i, (ns, addr)) in HOSTS.iter().enumerate() {
            let dev = format!("rwpkg{i}");
            ok(&run(Command::new("ip").args(["link", "set", &dev, "netns", ns])));
            let exec = |args: &[&str]| ok(&run(Command::new("ip").args(["netns", "exec", ns]).args(args)));
            exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", &dev]);
            exec(&["ip", "link", "set", &dev, "up"]);
            exec(&["ip", "link", "set", "lo", "up"]);
        }
        // Mount points for the hosts' folders (bound in each command's own mount namespace;
        // this machine's view of them stays empty).
        for d in ["/etc/rackwire", "/var/lib/rackwire"] {
            if !Path::new(d).exists() {
                std::fs::create_dir_all(d).unwrap();
                h.made_dirs.push(d.into());
            }
        }
        h
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for (ns, _) in HOSTS {
            let _ = run(Command::new("ip").args(["netns", "del", ns]));
        }
        for d in &self.made_dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// One host: its namespace, its name, and its folder (`etc`, `var`, `creds`).
struct Host {
    ns: &'static str,
    name: &'static str,
    dir: PathBuf,
}

impl Host {
    /// `argv` run in this host as the package put it there: in its network namespace, in a
    /// mount namespace of its own with the host's folders in place, with `env`.
    fn command(&self, argv: &[String], env: &[(String, String)]) -> Command {
        let script = format!(
            "mount --bind {0}/etc /etc/rackwire && mount --bind {0}/var /var/lib/rackwire && exec \"$@\"",
            self.dir.display()
        );
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.ns, "unshare", "-m", "sh", "-c", &script, "sh"]).args(argv);
        c.env_remove(rackwire::vars::CONFIG).env_remove(rackwire::vars::MH).env_remove(rackwire::vars::SECRET);
        c.env_remove(rackwire::vars::SECRET_FILE).envs(env.iter().map(|(k, v)| (k, v)));
        c
    }

    /// The unit's command and environment as systemd would run them (`%H` the host's name,
    /// `%d` the folder of its credentials, a copy of the secret only the service reads).
    fn unit(&self, root: &Path, unit: &str) -> (Vec<String>, Vec<(String, String)>) {
        let text = std::fs::read_to_string(root.join("usr/lib/systemd/system").join(unit)).expect("the unit");
        let creds = self.dir.join("creds");
        let fill = |s: &str| {
            s.replace("%H", self.name)
                .replace("%d", creds.to_str().unwrap())
                .replace("/usr/bin/rackwire", root.join("usr/bin/rackwire").to_str().unwrap())
        };
        let exec = text.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
        let argv = fill(exec).split_whitespace().map(String::from).collect();
        let env = text
            .lines()
            .filter_map(|l| l.strip_prefix("Environment="))
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), fill(v)))
            .collect();
        (argv, env)
    }
}

/// `rackwire doctor --json` in `host`: whether it passed, and its findings.
fn doctor(host: &Host, rackwire: &Path) -> (bool, Vec<serde_json::Value>) {
    // Its probe node pins the management host's key in a state folder of the host's.
    let state = vec![(rackwire::vars::STATE_DIR.to_string(), host.dir.join("var/doctor").display().to_string())];
    let o = run(&mut host.command(&[rackwire.display().to_string(), "doctor".into(), "--json".into()], &state));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("doctor's JSON: {e}\n{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    });
    assert_eq!(v["passed"].as_bool().unwrap(), o.status.success(), "exit status and verdict agree: {v}");
    (v["passed"].as_bool().unwrap(), v["findings"].as_array().unwrap().clone())
}

fn failed<'a>(findings: &'a [serde_json::Value], check: &str) -> Option<&'a serde_json::Value> {
    findings.iter().find(|f| f["check"] == check && f["status"] == "fail")
}

/// Whether the doctor found `check` ok, saying something `what` accepts.
fn found_ok(findings: &[serde_json::Value], check: &str, what: impl Fn(&str) -> bool) -> bool {
    findings.iter().any(|f| f["check"] == check && f["status"] == "ok" && f["what"].as_str().is_some_and(&what))
}

// Checks the package end to end on two hosts made of namespaces, from the unpacked files only:
// it holds the manual pages (the commands', the configuration file's); systemd reads both units without a complaint (where systemd-analyze is installed); the
// management host's and the agents' units run as written (the host's file read from
// /etc/rackwire with no variable naming it, the secret handed over as a credential); both
// nodes join under the hosts' names; a C program built against the package's header,
// pkg-config file and library writes from one host into a region of the other (the owner
// checks the bytes and its notification); `rackwire doctor` passes on a host (its other node's
// link reached, the path to it proven for full frames) and fails, naming the fix, once a problem is planted: the secret file made
// 0644, strict reverse-path filtering on the rail, the management host's port held by another
// program (on the host running it, the port held by the management host itself passes).
#[test]
fn the_package_brings_up_a_two_host_rack() {
    if !is_root() {
        eprintln!("SKIPPED the_package_brings_up_a_two_host_rack: needs root (namespaces, mounts, TUN)");
        return;
    }
    for (prog, arg) in
        [("dpkg-deb", "--version"), ("unshare", "--version"), ("cc", "--version"), ("pkg-config", "--version")]
    {
        if !have(prog, arg) {
            eprintln!("SKIPPED the_package_brings_up_a_two_host_rack: {prog} is not installed");
            return;
        }
    }
    let work = TempDir::new("package");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let build = Path::new(env!("CARGO_BIN_EXE_rackwire")).parent().unwrap().to_path_buf();
    // The C library and the provider as the package carries them (`cargo test` builds neither).
    rackwire_tests::build_c_forms(&["rackwire-ffi", "rackwire-ofi"]);
    let deb = ok(&run(Command::new(repo.join("scripts/package-deb.sh")).args([
        "--from",
        build.to_str().unwrap(),
        "--out",
        work.0.join("deb").to_str().unwrap(),
    ])));
    let root = work.0.join("root");
    ok(&run(Command::new("dpkg-deb").args(["-x", deb.trim(), root.to_str().unwrap()])));
    let rackwire = root.join("usr/bin/rackwire");
    // Its manual: a page per command the help lists, and one for the configuration file.
    for page in ["man1/rackwire.1.gz", "man1/rackwire-doctor.1.gz", "man1/rackwire-mh.1.gz", "man5/rackwire.toml.5.gz"]
    {
        assert!(root.join("usr/share/man").join(page).is_file(), "{page} is in the package");
    }

    // The units as systemd reads them (where it is installed): no unknown setting, no bad
    // value, the command there.
    if have("systemd-analyze", "--version") {
        let units = work.0.join("units");
        std::fs::create_dir_all(&units).unwrap();
        let mut paths = Vec::new();
        for u in ["rackwire-mh.service", "rackwire-agent.service"] {
            let text = std::fs::read_to_string(root.join("usr/lib/systemd/system").join(u)).unwrap();
            let p = units.join(u);
            std::fs::write(&p, text.replace("/usr/bin/rackwire", rackwire.to_str().unwrap())).unwrap();
            paths.push(p);
        }
        let o = run(Command::new("systemd-analyze").args(["verify", "--man=no"]).args(&paths));
        assert!(o.status.success() && o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    } else {
        eprintln!(
            "the_package_brings_up_a_two_host_rack: systemd-analyze is not installed; the units' syntax is not checked"
        );
    }

    let mut rack = Hosts::up();
    let hosts: Vec<Host> = HOSTS
        .iter()
        .zip(["pkg-a", "pkg-b"])
        .map(|((ns, addr), name)| {
            let dir = work.0.join(name);
            for d in ["etc", "var", "var/agent", "creds", "run"] {
                std::fs::create_dir_all(dir.join(d)).unwrap();
            }
            for d in ["var", "var/agent", "run"] {
                std::fs::set_permissions(dir.join(d), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
            }
            // The host's file: the package's, with the rack's values set as a user would.
            let shipped = std::fs::read_to_string(root.join("etc/rackwire/rackwire.toml")).unwrap();
            let mh = HOSTS[0].1;
            // Each host a memory domain of its own: the hosts share this machine's memory, but
            // reach each other over the rail as real hosts do.
            let file = format!(
                "{shipped}\nmh = \"{mh}:7700\"\nsecret_file = \"/etc/rackwire/secret\"\nlinks = [\"{addr}:0\"]\n\
                 memory_domain = \"{name}\"\n\n[management_host]\nlisten = \"{mh}:7700\"\n"
            );
            std::fs::write(dir.join("etc/rackwire.toml"), file).unwrap();
            for f in [dir.join("etc/secret"), dir.join("creds/secret")] {
                std::fs::write(&f, format!("{SECRET}\n")).unwrap();
                std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            }
            Host { ns, name, dir }
        })
        .collect();

    // The services, as their units say.
    let (argv, env) = hosts[0].unit(&root, "rackwire-mh.service");
    std::fs::create_dir_all(hosts[0].dir.join("var/mh")).unwrap();
    rack.children
        .push(hosts[0].command(&argv, &env).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("the mh"));
    for h in &hosts {
        let (argv, mut env) = h.unit(&root, "rackwire-agent.service");
        // systemd makes the unit's runtime folder; here, one in the host's folder.
        for (k, v) in env.iter_mut() {
            if k == rackwire::vars::RUNTIME_DIR {
                *v = h.dir.join("run").display().to_string();
            }
        }
        rack.children
            .push(h.command(&argv, &env).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("an agent"));
    }

    // Both nodes up under the hosts' names, as `rackwire nodes` (the host's file only) says.
    let deadline = Instant::now() + UP_WAIT;
    loop {
        let o = run(&mut hosts[1].command(&[rackwire.display().to_string(), "nodes".into(), "--json".into()], &[]));
        let up = serde_json::from_slice::<serde_json::Value>(&o.stdout).ok().map(|v| {
            let nodes = v["nodes"].as_array().cloned().unwrap_or_default();
            ["pkg-a", "pkg-b"].iter().all(|n| nodes.iter().any(|x| x["info"]["name"] == *n && x["up"] == true))
        });
        if up == Some(true) {
            break;
        }
        assert!(Instant::now() < deadline, "the agents did not both come up: {}", String::from_utf8_lossy(&o.stderr));
        std::thread::sleep(Duration::from_millis(200));
    }

    // A write across the hosts from a C program built against the package.
    let lib = root
        .join("usr/lib")
        .join(String::from_utf8_lossy(&run(Command::new("gcc").arg("-print-multiarch")).stdout).trim());
    let flags = ok(&run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "rackwire"])
        .env("PKG_CONFIG_PATH", lib.join("pkgconfig"))
        .env("PKG_CONFIG_SYSROOT_DIR", &root)));
    let notify = work.0.join("notify");
    ok(&run(Command::new("cc")
        .arg(repo.join("examples/c/notify.c"))
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(&notify)));
    let ld = vec![("LD_LIBRARY_PATH".to_string(), lib.display().to_string())];
    // Each program its name, and a state folder in its host's (where it pins the management
    // host's key at first use), not the user's home.
    let with_name = |h: &Host, n: &str| {
        let state = h.dir.join("var").join(n).display().to_string();
        [
            ld.clone(),
            vec![(rackwire::vars::NAME.to_string(), n.to_string()), (rackwire::vars::STATE_DIR.to_string(), state)],
        ]
        .concat()
    };
    let owner = hosts[0]
        .command(&[notify.display().to_string(), "owner".into()], &with_name(&hosts[0], "c-owner"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let writer =
        run(&mut hosts[1].command(&[notify.display().to_string(), "writer".into()], &with_name(&hosts[1], "c-writer")));
    let owner = owner.wait_with_output().unwrap();
    ok(&writer);
    assert!(ok(&owner).contains("owner ok"), "{}", String::from_utf8_lossy(&owner.stdout));

    // The doctor: the host is ready, its other node's link reached (the management host's
    // address in its file is host A's: fine, it runs there).
    let (passed, found) = doctor(&hosts[1], &rackwire);
    assert!(passed, "{found:#?}");
    assert!(found_ok(&found, "links reached", |w| w.starts_with("pkg-a")), "{found:#?}");
    // ... and the path to it carries the hosts' full frames both ways (proven by the
    // connection's padded probes).
    assert!(found_ok(&found, "path mtu", |w| w.starts_with("pkg-a: frames of")), "{found:#?}");

    // Planted: the secret file open to others.
    let secret = hosts[1].dir.join("etc/secret");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (passed, found) = doctor(&hosts[1], &rackwire);
    assert!(!passed);
    let f = failed(&found, "secret file").unwrap_or_else(|| panic!("{found:#?}"));
    assert!(f["fix"].as_str().unwrap().contains("chmod 600"), "{f}");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();

    // Planted: strict reverse-path filtering on the rail.
    let sysctl = |v: &str| {
        ok(&run(Command::new("ip").args([
            "netns",
            "exec",
            hosts[1].ns,
            "sysctl",
            "-qw",
            &format!("net.ipv4.conf.rwpkg1.rp_filter={v}"),
        ])))
    };
    sysctl("1");
    let (passed, found) = doctor(&hosts[1], &rackwire);
    assert!(!passed);
    let f = failed(&found, "rp_filter").unwrap_or_else(|| panic!("{found:#?}"));
    assert_eq!(f["fix"], "sysctl -w net.ipv4.conf.rwpkg1.rp_filter=2", "{f}");
    sysctl("2");

    // The management host's port: held by it on host A (as it should); on host B, planted, held
    // by another program where B's file says a management host would listen.
    let (passed, found) = doctor(&hosts[0], &rackwire);
    assert!(passed, "{found:#?}");
    assert!(found_ok(&found, "ports", |w| w.contains("held by rackwire")), "{found:#?}");
    let b_file = hosts[1].dir.join("etc/rackwire.toml");
    let kept = std::fs::read_to_string(&b_file).unwrap();
    std::fs::write(&b_file, kept.replace("listen = \"198.18.61.1:7700\"", "listen = \"198.18.61.2:7700\"")).unwrap();
    let squatter = "import socket, time\ns = socket.socket()\ns.bind(('198.18.61.2', 7700))\ns.listen()\nprint('up', flush=True)\ntime.sleep(60)\n";
    let mut squat = Command::new("ip")
        .args(["netns", "exec", hosts[1].ns, "python3", "-c", squatter])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(squat.stdout.take().unwrap()), &mut line).unwrap();
    rack.children.push(squat);
    let (passed, found) = doctor(&hosts[1], &rackwire);
    assert!(!passed);
    let f = failed(&found, "ports").unwrap_or_else(|| panic!("{found:#?}"));
    assert!(f["what"].as_str().unwrap().contains("198.18.61.2:7700 is held by python3"), "{f}");
    assert!(f["fix"].as_str().unwrap().starts_with("stop python3"), "{f}");

    drop(rack);
}
