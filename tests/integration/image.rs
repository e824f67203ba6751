//! The OCI image `scripts/image` builds without a container engine: the bridge runs from the
//! image's unpacked root filesystem, as the image's user, against the real API server and broker;
//! the image is the one the Dockerfile describes; its SBOM lists the Debian packages it holds.
//!
//! The image is read from `KEB_IMAGE_DIR` (`scripts/test` builds it with `scripts/image` and sets
//! it), umoci from `KEB_UMOCI` (set by `scripts/testenv`). A test without either fails.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::deploy::dockerfile;
use crate::harness::{Bridge, Reader, Received, get};
use crate::support::{self, kube_client, unique_name, unique_namespace, wait_until};

/// Where the bridge's configuration directory is mounted, as the chart mounts its ConfigMap.
const CONFIG_DIR: &str = "/etc/kube-event-bridge";
/// The image's platform, and where Debian keeps that platform's libraries.
const ARCHITECTURE: &str = "amd64";
const LIBRARY_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// A variable these tests need, or a panic saying how to provide it.
pub(crate) fn required(name: &str, how: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| panic!("{name} is not set: {how}, or run everything with scripts/test"))
}

fn umoci() -> String {
    let umoci = required("KEB_UMOCI", "`eval \"$(scripts/testenv env)\"` sets it");
    assert!(
        Path::new(&umoci).is_file(),
        "KEB_UMOCI={umoci} does not exist"
    );
    umoci
}

/// Runs a command that must succeed and returns its standard output.
pub(crate) fn output(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The image `scripts/image` wrote: its directory, layout, tag, manifest digest and configuration.
pub(crate) struct Image {
    pub(crate) dir: PathBuf,
    layout: PathBuf,
    tag: String,
    pub(crate) digest: String,
    manifest: Value,
    config: Value,
}

impl Image {
    pub(crate) fn load() -> Image {
        let dir = PathBuf::from(required(
            "KEB_IMAGE_DIR",
            "build the image with `scripts/image` and set KEB_IMAGE_DIR=target/image",
        ));
        Image::in_dir(dir)
    }

    /// The image of the OCI layout `dir/oci` (one image, tagged).
    pub(crate) fn in_dir(dir: PathBuf) -> Image {
        let layout = dir.join("oci");
        let blob = |digest: &str| layout.join("blobs").join(digest.replace(':', "/"));
        let index = read_json(&layout.join("index.json"));
        let manifests = index["manifests"]
            .as_array()
            .expect("index.json lists manifests");
        assert_eq!(manifests.len(), 1, "one image in the layout: {index}");
        let digest = manifests[0]["digest"]
            .as_str()
            .expect("a digest")
            .to_string();
        let tag = manifests[0]["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .expect("a tag")
            .to_string();
        let manifest = read_json(&blob(&digest));
        let config = read_json(&blob(
            manifest["config"]["digest"].as_str().expect("config"),
        ));
        Image {
            dir,
            layout,
            tag,
            digest,
            manifest,
            config,
        }
    }

    /// The layers unpacked by umoci into `<returned dir>/rootfs`: what a container runtime runs.
    pub(crate) fn unpack(&self) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        let image = format!("{}:{}", self.layout.display(), self.tag);
        output(
            Command::new(umoci())
                .args(["raw", "unpack", "--image", &image])
                .arg(dir.path().join("rootfs")),
        );
        dir
    }

    /// A field of the image's runtime configuration.
    fn runtime(&self, field: &str) -> &Value {
        &self.config["config"][field]
    }

    fn strings(&self, field: &str) -> Vec<String> {
        serde_json::from_value(self.runtime(field).clone())
            .unwrap_or_else(|e| panic!("config.{field}: {e}"))
    }

    /// The user as uid and gid (`65532:65532`).
    pub(crate) fn user(&self) -> (u32, u32) {
        let user = self.runtime("User").as_str().expect("config.User");
        let (uid, gid) = user.split_once(':').expect("User is uid:gid");
        (
            uid.parse().expect("a numeric uid"),
            gid.parse().expect("a numeric gid"),
        )
    }
}

/// `Package` → `Version` of the packages dpkg lists as installed in `rootfs`.
fn installed_packages(rootfs: &Path) -> BTreeMap<String, String> {
    let status = std::fs::read_to_string(rootfs.join("var/lib/dpkg/status")).expect("dpkg status");
    status
        .split("\n\n")
        .filter_map(|paragraph| {
            let field = |name: &str| {
                paragraph
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                    .map(str::to_string)
            };
            (field("Status")? == "install ok installed").then_some(())?;
            Some((field("Package")?, field("Version")?))
        })
        .collect()
}

/// The command a container runtime would run for `image` with `config_dir` mounted read-only at
/// [`CONFIG_DIR`]: its entrypoint and default command, as its user, in `rootfs` (read-only, as
/// the chart runs it; /proc and /dev mounted), with the image's environment and `vars` alone.
fn in_image(image: &Image, rootfs: &Path, config_dir: &Path, vars: &[(&str, &str)]) -> Command {
    let mut command = image.strings("Entrypoint");
    command.extend(image.strings("Cmd"));
    running_in_image(image, rootfs, config_dir, vars, &command)
}

/// [`in_image`] running `command` (a program on the image's PATH and its arguments) instead of
/// the image's entrypoint and command, as `kubectl exec` runs one in the bridge's container.
pub(crate) fn running_in_image(
    image: &Image,
    rootfs: &Path,
    config_dir: &Path,
    vars: &[(&str, &str)],
    program: &[String],
) -> Command {
    const RUN: &str = r#"set -eu
root=$1 config=$2 target=$1$3 user=$4
shift 4
mkdir -p "$target" "$root/dev"
mount --bind "$root" "$root"
mount --bind -o ro "$config" "$target"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount -o remount,bind,ro "$root"
exec chroot --userspec="$user" "$root" "$@"
"#;
    let (uid, gid) = image.user();
    let mut command = Command::new("unshare");
    command
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            RUN,
            "sh",
        ])
        .arg(rootfs)
        .arg(config_dir)
        .arg(CONFIG_DIR)
        .arg(format!("{uid}:{gid}"))
        .args(program)
        .env_clear();
    for entry in image.strings("Env") {
        let (name, value) = entry.split_once('=').expect("Env entries are NAME=value");
        command.env(name, value);
    }
    command.envs(vars.iter().copied());
    command
}

/// Makes the bridge's directory the image's configuration directory: `files` beside `bridge.yaml`
/// (mode 0400), `config.yaml` (the image's default command reads it) a link to `bridge.yaml`, all
/// owned by the image's user.
pub(crate) fn configuration_directory(
    dir: &Path,
    (uid, gid): (u32, u32),
    files: &[(&str, Vec<u8>)],
) {
    for (name, content) in files {
        let path = dir.join(name);
        std::fs::write(&path, content).expect("write a configuration file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).expect("chmod");
    }
    std::os::unix::fs::symlink("bridge.yaml", dir.join("config.yaml")).expect("config.yaml");
    for name in files.iter().map(|(n, _)| *n).chain(["bridge.yaml", "."]) {
        std::os::unix::fs::chown(dir.join(name), Some(uid), Some(gid)).expect("chown");
    }
}

/// Starts the bridge from the image's root filesystem on `config`, with the test kubeconfig and
/// `files` in its configuration directory.
pub(crate) fn start_from_image(
    image: &Image,
    rootfs: &Path,
    config: &str,
    files: Vec<(&str, Vec<u8>)>,
) -> Bridge {
    let kubeconfig = std::fs::read(support::env().kubeconfig).expect("read the kubeconfig");
    Bridge::start_via(config, |dir| {
        let mut files = files;
        files.push(("kubeconfig", kubeconfig));
        configuration_directory(dir, image.user(), &files);
        let kubeconfig = format!("{CONFIG_DIR}/kubeconfig");
        let vars = [
            ("KUBECONFIG", kubeconfig.as_str()),
            ("KEB_LOG_FORMAT", "json"),
            ("RUST_LOG", "info,kube_event_bridge=debug"),
        ];
        in_image(image, rootfs, dir, &vars)
    })
}

/// A `/proc/<pid>/status` line's values (`Uid`, `Gid`, `Groups`).
fn proc_status(pid: u32, field: &str) -> Vec<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    line.split_whitespace().map(str::to_string).collect()
}

fn named(name: &str) -> impl Fn(&[Received]) -> bool + '_ {
    move |got| {
        got.iter()
            .any(|r| r.ext("name") == name && r.change() == "added")
    }
}

async fn create_config_map(client: &kube::Client, namespace: &str, name: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap_or_else(|e| panic!("cannot create ConfigMap {namespace}/{name}: {e}"));
}

/// The image's entrypoint and default command run as its non-root user from its read-only root
/// filesystem: the bridge becomes ready, and a ConfigMap created afterwards arrives on stdout.
#[tokio::test(flavor = "multi_thread")]
async fn the_image_runs_the_bridge_as_its_user_from_its_root_filesystem() {
    let image = Image::load();
    let unpacked = image.unpack();
    let rootfs = unpacked.path().join("rootfs");
    let client = kube_client().await;
    let ns = unique_namespace(&client, "image").await;
    let config = format!(
        "cluster: {}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink:\n  stdout: {{}}\n",
        unique_name("image")
    );
    let mut bridge = start_from_image(&image, &rootfs, &config, Vec::new());
    bridge.wait_synced(1).await;

    let address = bridge.admin_address().await;
    wait_until(
        "the bridge from the image is ready",
        Duration::from_secs(30),
        || async { (get(&address, "/readyz").await.0 == 200).then_some(()) },
    )
    .await;
    let pid = bridge.pid();
    let (uid, gid) = image.user();
    assert_eq!(proc_status(pid, "Uid"), vec![uid.to_string(); 4]);
    assert_eq!(proc_status(pid, "Gid"), vec![gid.to_string(); 4]);
    assert!(
        proc_status(pid, "Groups")
            .iter()
            .all(|g| *g == gid.to_string()),
        "supplementary groups: {:?}",
        proc_status(pid, "Groups")
    );
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let expected: Vec<String> = image
        .strings("Entrypoint")
        .into_iter()
        .chain(image.strings("Cmd"))
        .collect();
    assert_eq!(argv, expected, "the image's entrypoint and default command");
    // The process's root is the image's root filesystem, not the host's.
    let os_release =
        std::fs::read_to_string(format!("/proc/{pid}/root/etc/os-release")).expect("os-release");
    let image_os_release =
        std::fs::read_to_string(rootfs.join("etc/os-release")).expect("os-release");
    assert_eq!(os_release, image_os_release);
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("mountinfo");
    let root_options = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|fields| fields.get(4) == Some(&"/"))
        .map(|fields| fields[5].to_string())
        .expect("the process's root mount");
    assert!(
        root_options.split(',').any(|o| o == "ro"),
        "a read-only root: {root_options}"
    );

    create_config_map(&client, &ns, "from-the-image").await;
    Reader::stdout(&bridge)
        .read_until(Duration::from_secs(60), named("from-the-image"))
        .await;
}

/// From the image, the bridge publishes to Kafka over TLS with SCRAM: the image's OpenSSL (linked
/// by librdkafka) verifies the broker against a CA file mounted beside the configuration.
#[tokio::test(flavor = "multi_thread")]
async fn the_images_openssl_publishes_to_kafka_over_tls() {
    let image = Image::load();
    let unpacked = image.unpack();
    let rootfs = unpacked.path().join("rootfs");
    let scram = support::kafka_scram();
    let (ca, _) = support::testenv_cas();
    let client = kube_client().await;
    let ns = unique_namespace(&client, "image-tls").await;
    let cluster = unique_name("image-tls");
    let topic = format!("k8s.{cluster}.core.configmaps");
    let mut reader = Reader::kafka(std::slice::from_ref(&topic)).await;
    let config = format!(
        "cluster: {cluster}\nresources:\n- {{apiVersion: v1, resource: configmaps, namespaces: [{ns}]}}\nsink:\n  kafka:\n    bootstrapServers: \"{}\"\n    properties: {{security.protocol: sasl_ssl, sasl.mechanism: SCRAM-SHA-512, sasl.username: {}, ssl.ca.location: {CONFIG_DIR}/ca.crt}}\n    propertyFiles: {{sasl.password: {CONFIG_DIR}/kafka-password}}\n",
        scram.bootstrap, scram.username
    );
    let files = vec![
        ("ca.crt", std::fs::read(&ca).expect("the environment's CA")),
        ("kafka-password", scram.password.clone().into_bytes()),
    ];
    let mut bridge = start_from_image(&image, &rootfs, &config, files);
    bridge.wait_synced(1).await;
    create_config_map(&client, &ns, "over-tls-from-the-image").await;
    reader
        .read_until(Duration::from_secs(60), named("over-tls-from-the-image"))
        .await;
    assert!(
        !bridge.log_text().contains(&scram.password),
        "the password appears in the log"
    );
}

/// The Dockerfile's runtime stage at a glance.
struct Dockerfile {
    release: String,
    packages: BTreeSet<String>,
    /// `useradd`'s and `groupadd`'s options (`--uid` → `65532`) and the user's name.
    useradd: BTreeMap<String, String>,
    groupadd: BTreeMap<String, String>,
    binary: String,
    user: String,
    expose: String,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
}

/// The options of `command` in `run` (`--uid` → `65532`; those not in `valued` take no value),
/// and its operand as `name`.
fn options_of(run: &str, command: &str, valued: &[&str]) -> BTreeMap<String, String> {
    let words = run
        .split(command)
        .nth(1)
        .unwrap_or_else(|| panic!("no {command} in the runtime stage: {run}"))
        .split("&&")
        .next()
        .unwrap();
    let mut options = BTreeMap::new();
    let mut words = words.split_whitespace();
    while let Some(word) = words.next() {
        let (key, value) = match word.strip_prefix("--") {
            Some(flag) if valued.contains(&flag) => (flag, words.next().unwrap_or_default()),
            Some(flag) => (flag, ""),
            None => ("name", word),
        };
        options.insert(key.to_string(), value.to_string());
    }
    options
}

fn parse_dockerfile() -> Dockerfile {
    let ins = dockerfile();
    let arg = |name: &str| {
        ins.iter()
            .filter(|(op, _)| op == "ARG")
            .find_map(|(_, a)| a.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no ARG {name}"))
            .to_string()
    };
    let last_from = ins
        .iter()
        .rposition(|(op, _)| op == "FROM")
        .expect("a FROM");
    let base = ins[last_from]
        .1
        .replace("${DEBIAN_RELEASE}", &arg("DEBIAN_RELEASE"));
    let release = base
        .strip_prefix("debian:")
        .and_then(|b| b.strip_suffix("-slim"))
        .unwrap_or_else(|| {
            panic!("the runtime stage starts from debian:<release>-slim, not {base}")
        })
        .to_string();
    let runtime = &ins[last_from..];
    let one = |op: &str| {
        let found: Vec<&String> = runtime
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, a)| a)
            .collect();
        assert_eq!(found.len(), 1, "one {op} in the runtime stage: {found:?}");
        found[0].clone()
    };
    let run = one("RUN");
    let packages = run
        .split("apt-get install")
        .nth(1)
        .unwrap()
        .split("&&")
        .next()
        .unwrap()
        .split_whitespace()
        .filter(|w| !w.starts_with('-'))
        .map(str::to_string)
        .collect();
    assert!(
        run.contains("apt-get install -y --no-install-recommends"),
        "{run}"
    );
    let copy = one("COPY");
    let json = |op: &str| -> Vec<String> {
        serde_json::from_str(&one(op)).unwrap_or_else(|e| panic!("{op} in exec form: {e}"))
    };
    Dockerfile {
        release,
        packages,
        useradd: options_of(&run, "useradd", &["uid", "gid", "home-dir", "shell"]),
        groupadd: options_of(&run, "groupadd", &["gid"]),
        binary: copy
            .split_whitespace()
            .last()
            .expect("a COPY destination")
            .to_string(),
        user: one("USER"),
        expose: one("EXPOSE"),
        entrypoint: json("ENTRYPOINT"),
        cmd: json("CMD"),
    }
}

/// What the binary asks of the system: its libraries, its interpreter, the newest glibc symbol
/// version it uses, and whether it has packed relative relocations (DT_RELR, glibc 2.36 or later).
struct Needs {
    libraries: Vec<String>,
    interpreter: String,
    glibc: (u32, u32),
    relr: bool,
}

fn needs(binary: &Path) -> Needs {
    let text = output(
        Command::new("readelf")
            .args(["-d", "-l", "-V", "-W"])
            .arg(binary),
    );
    let bracketed = |line: &str| {
        line.split('[')
            .nth(1)
            .and_then(|s| s.split(']').next())
            .map(str::to_string)
    };
    let version = |v: &str| {
        let (major, minor) = v.split_once('.')?;
        Some((major.parse().ok()?, minor.split('.').next()?.parse().ok()?))
    };
    Needs {
        libraries: text
            .lines()
            .filter(|l| l.contains("(NEEDED)"))
            .filter_map(bracketed)
            .collect(),
        interpreter: text
            .lines()
            .find(|l| l.contains("Requesting program interpreter"))
            .and_then(|l| {
                bracketed(l)?
                    .strip_prefix("Requesting program interpreter: ")
                    .map(str::to_string)
            })
            .expect("an interpreter"),
        glibc: text
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("GLIBC_").and_then(version))
            .max()
            .expect("glibc symbol versions"),
        relr: text.contains("(RELR)"),
    }
}

/// The image is the one the Dockerfile describes: the same Debian release, runtime packages, user
/// and group, binary path, entrypoint, default command and port; and its root filesystem holds
/// every library, loader and glibc version the binary needs, and CA certificates.
#[test]
fn the_dockerfile_describes_the_image() {
    let image = Image::load();
    let unpacked = image.unpack();
    let rootfs = unpacked.path().join("rootfs");
    let docker = parse_dockerfile();

    assert_eq!(image.config["os"], "linux");
    assert_eq!(image.config["architecture"], ARCHITECTURE);
    assert_eq!(
        image.runtime("User").as_str(),
        Some(docker.user.as_str()),
        "USER"
    );
    assert_eq!(image.strings("Entrypoint"), docker.entrypoint, "ENTRYPOINT");
    assert_eq!(image.strings("Cmd"), docker.cmd, "CMD");
    assert_eq!(
        docker.entrypoint,
        std::slice::from_ref(&docker.binary),
        "the entrypoint is the copied binary"
    );
    let ports: Vec<&String> = image
        .runtime("ExposedPorts")
        .as_object()
        .expect("ExposedPorts")
        .keys()
        .collect();
    assert_eq!(ports, [&format!("{}/tcp", docker.expose)], "EXPOSE");
    assert!(
        image.strings("Env").contains(
            &"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()
        ),
        "the PATH of Debian's images: {:?}",
        image.strings("Env")
    );

    let os_release = std::fs::read_to_string(rootfs.join("etc/os-release")).expect("os-release");
    assert!(
        os_release
            .lines()
            .any(|l| l == format!("VERSION_CODENAME={}", docker.release)),
        "the image is Debian {}:\n{os_release}",
        docker.release
    );
    let installed = installed_packages(&rootfs);
    for package in &docker.packages {
        assert!(
            installed.contains_key(package),
            "{package} is not installed in the image"
        );
    }

    let (uid, gid) = image.user();
    let name = &docker.useradd["name"];
    assert_eq!(docker.useradd["uid"], uid.to_string(), "useradd --uid");
    assert_eq!(docker.useradd["gid"], gid.to_string(), "useradd --gid");
    assert_eq!(docker.groupadd["gid"], gid.to_string(), "groupadd --gid");
    assert_eq!(&docker.groupadd["name"], name, "groupadd's group");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).expect("passwd");
    let entry = format!(
        "{name}:x:{uid}:{gid}::{}:{}",
        docker.useradd["home-dir"], docker.useradd["shell"]
    );
    assert!(
        passwd.lines().any(|l| l == entry),
        "{entry} not in /etc/passwd:\n{passwd}"
    );
    let group = std::fs::read_to_string(rootfs.join("etc/group")).expect("group");
    assert!(
        group.lines().any(|l| l == format!("{name}:x:{gid}:")),
        "{name} not in /etc/group:\n{group}"
    );

    let binary = rootfs.join(docker.binary.trim_start_matches('/'));
    let meta =
        std::fs::symlink_metadata(&binary).unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    assert!(meta.is_file(), "{} is a regular file", docker.binary);
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid(), meta.gid()),
        (0o755, 0, 0),
        "{}",
        docker.binary
    );

    let needs = needs(&binary);
    for library in &needs.libraries {
        assert!(
            rootfs.join(LIBRARY_DIR).join(library).exists(),
            "the binary needs {library}, which the image lacks"
        );
    }
    let interpreter = rootfs.join(needs.interpreter.trim_start_matches('/'));
    assert!(
        interpreter.exists(),
        "no loader {} in the image",
        needs.interpreter
    );
    let libc = &installed["libc6"];
    let (major, minor) = libc.split('-').next().unwrap().split_once('.').unwrap();
    let image_glibc: (u32, u32) = (major.parse().unwrap(), minor.parse().unwrap());
    assert!(
        image_glibc >= needs.glibc,
        "the binary needs glibc {:?}, the image has {libc}",
        needs.glibc
    );
    assert!(
        !needs.relr || image_glibc >= (2, 36),
        "DT_RELR needs glibc 2.36, the image has {libc}"
    );
    let certificates = rootfs.join("etc/ssl/certs/ca-certificates.crt");
    let bundle = std::fs::read_to_string(&certificates).expect("the CA certificates bundle");
    assert!(
        bundle.matches("BEGIN CERTIFICATE").count() > 100,
        "a near-empty {}",
        certificates.display()
    );
}

/// The SBOM beside the image (SPDX, by syft) names this image and lists exactly the Debian
/// packages installed in it, with their versions and licences.
#[test]
fn the_sbom_lists_the_images_debian_packages() {
    let image = Image::load();
    let unpacked = image.unpack();
    let installed = installed_packages(&unpacked.path().join("rootfs"));
    let sbom = read_json(&image.dir.join("sbom.spdx.json"));

    assert!(
        sbom["spdxVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("SPDX-2.")),
        "{}",
        sbom["spdxVersion"]
    );
    let creators = sbom["creationInfo"]["creators"].to_string();
    assert!(creators.contains("Tool: syft-"), "made by syft: {creators}");
    let packages = sbom["packages"].as_array().expect("packages");
    let described: Vec<&Value> = packages
        .iter()
        .filter(|p| p["primaryPackagePurpose"] == "CONTAINER")
        .collect();
    assert_eq!(described.len(), 1, "one image described");
    let hex = image
        .digest
        .strip_prefix("sha256:")
        .expect("a sha256 digest");
    assert_eq!(
        (
            &described[0]["name"],
            &described[0]["versionInfo"],
            &described[0]["checksums"][0]["checksumValue"]
        ),
        (&json!("kube-event-bridge"), &json!(image.tag), &json!(hex)),
        "the SBOM describes this image"
    );
    let purl = |p: &Value| {
        p["externalRefs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["referenceType"] == "purl")
            .and_then(|r| r["referenceLocator"].as_str())
            .map(str::to_string)
    };
    let debian: BTreeMap<String, &Value> = packages
        .iter()
        .filter(|p| purl(p).is_some_and(|u| u.starts_with("pkg:deb/debian/")))
        .map(|p| (p["name"].as_str().expect("a name").to_string(), p))
        .collect();
    let listed: BTreeMap<String, String> = debian
        .iter()
        .map(|(name, p)| {
            (
                name.clone(),
                p["versionInfo"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        listed, installed,
        "the SBOM's Debian packages are the image's"
    );
    for package in ["libssl3t64", "zlib1g", "ca-certificates", "libc6"] {
        let licence = debian[package]["licenseDeclared"]
            .as_str()
            .unwrap_or_default();
        assert!(
            !licence.is_empty() && licence != "NOASSERTION",
            "{package}'s licence is in the SBOM (its copyright file stays in the image): {licence:?}"
        );
    }
}

/// A tool `scripts/testenv` builds, from its variable, or a panic naming it.
pub(crate) fn testenv_tool(var: &str) -> String {
    let path = required(var, "`eval \"$(scripts/testenv env)\"` sets it");
    assert!(Path::new(&path).is_file(), "{var}={path} does not exist");
    path
}

/// `scripts/image` delivering the image of [`Image::load`] (`--push REF` or `--archive FILE`):
/// what it printed.
fn deliver(image: &Image, option: &str, target: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/image");
    output(
        Command::new(script)
            .arg("--image-dir")
            .arg(&image.dir)
            .args([option, target]),
    )
}

/// The SHA-256 digest (`sha256:…`) of a file, by coreutils.
pub(crate) fn sha256(path: &Path) -> String {
    let out = output(Command::new("sha256sum").arg(path));
    format!(
        "sha256:{}",
        out.split_whitespace().next().expect("a digest")
    )
}

/// GET `path` from the registry at `address` (plain HTTP/1.1, one request): status, headers
/// (lowercase names) and body.
pub(crate) fn registry_get(
    address: &str,
    path: &str,
    accept: &str,
) -> (u16, BTreeMap<String, String>, Vec<u8>) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address)
        .unwrap_or_else(|e| panic!("cannot connect to the registry at {address}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .expect("read the response");
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete response");
    let head = String::from_utf8_lossy(&response[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    assert!(
        !headers.contains_key("transfer-encoding"),
        "a manifest comes with a length: {head}"
    );
    (status, headers, response[split + 4..].to_vec())
}

/// `scripts/image --push` to the test environment's registry (CNCF distribution, plain HTTP on
/// 127.0.0.1): the registry serves the manifest under the tag with the digest scripts/image
/// printed, byte for byte; the image pulled back is the same manifest, configuration and layers.
#[test]
fn the_image_pushed_to_a_registry_keeps_its_digest() {
    let image = Image::load();
    let registry = required("KEB_REGISTRY", "`scripts/testenv up` starts the registry");
    let regctl = testenv_tool("KEB_REGCTL");
    let repository = format!("platform/{}", unique_name("keb"));
    let reference = format!("{registry}/{repository}:{}", image.tag);

    let printed = deliver(&image, "--push", &reference);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(
        lines,
        [
            format!("pushed: {registry}/{repository}@{}", image.digest),
            format!("digest: {}", image.digest)
        ],
        "what scripts/image --push prints"
    );

    // The registry's own answer, asked without regctl.
    let accept = "application/vnd.oci.image.manifest.v1+json";
    let (status, headers, body) = registry_get(
        &registry,
        &format!("/v2/{repository}/manifests/{}", image.tag),
        accept,
    );
    assert_eq!(status, 200, "{headers:?}");
    assert_eq!(headers["docker-content-digest"], image.digest);
    assert_eq!(headers["content-type"], accept);
    let served = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(served.path(), &body).expect("write the manifest");
    assert_eq!(sha256(served.path()), image.digest, "the manifest's bytes");
    let (status, _, by_digest) = registry_get(
        &registry,
        &format!("/v2/{repository}/manifests/{}", image.digest),
        accept,
    );
    assert_eq!((status, by_digest), (200, body), "the manifest by digest");

    // Pulled back into a new layout: the same manifest, configuration and layers.
    let pulled = tempfile::tempdir().expect("temp dir");
    let layout = pulled.path().join("oci");
    let host = format!("reg={registry},tls=disabled");
    output(Command::new(&regctl).args([
        "--host",
        &host,
        "image",
        "copy",
        &reference,
        &format!("ocidir://{}:{}", layout.display(), image.tag),
    ]));
    let index = read_json(&layout.join("index.json"));
    assert_eq!(index["manifests"][0]["digest"], image.digest.as_str());
    let mut blobs: Vec<&str> = vec![&image.digest];
    blobs.push(image.manifest["config"]["digest"].as_str().expect("config"));
    let layers = image.manifest["layers"].as_array().expect("layers");
    blobs.extend(layers.iter().map(|l| l["digest"].as_str().expect("digest")));
    for digest in blobs {
        let path = layout.join("blobs").join(digest.replace(':', "/"));
        assert_eq!(sha256(&path), digest, "{digest} pulled back");
    }
}

/// `scripts/image --archive`: one tar file that `docker load` and `kind load image-archive` read:
/// a `manifest.json` naming the image `kube-event-bridge:<version>` with its configuration and
/// layers, beside an OCI layout of the same manifest (so a containerd import keeps the digest).
#[test]
fn the_image_archive_names_the_image_and_holds_its_blobs() {
    let image = Image::load();
    let dir = tempfile::tempdir().expect("temp dir");
    let archive = dir.path().join("kube-event-bridge.tar");
    let printed = deliver(&image, "--archive", archive.to_str().expect("a UTF-8 path"));
    assert!(
        printed.contains(&format!("digest:  {}", image.digest)),
        "{printed}"
    );
    let unpacked = dir.path().join("unpacked");
    std::fs::create_dir(&unpacked).expect("mkdir");
    output(
        Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&unpacked),
    );

    let manifests = read_json(&unpacked.join("manifest.json"));
    let manifests = manifests.as_array().expect("manifest.json is a list");
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    let entry = &manifests[0];
    // Docker's and containerd's normal form of kube-event-bridge:<version>, the chart's default.
    let name = format!("docker.io/library/kube-event-bridge:{}", image.tag);
    assert_eq!(
        entry["RepoTags"],
        json!([name]),
        "the name the image is loaded under"
    );
    let blob_path = |digest: &str| format!("blobs/{}", digest.replace(':', "/"));
    let config = image.manifest["config"]["digest"].as_str().expect("config");
    assert_eq!(entry["Config"], blob_path(config).as_str());
    let layers: Vec<String> = image.manifest["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| blob_path(l["digest"].as_str().expect("digest")))
        .collect();
    assert_eq!(entry["Layers"], json!(layers));
    for path in layers
        .iter()
        .chain([&blob_path(config), &blob_path(&image.digest)])
    {
        let digest = path.trim_start_matches("blobs/").replace('/', ":");
        assert_eq!(
            sha256(&unpacked.join(path)),
            digest,
            "{path} in the archive"
        );
    }
    let index = read_json(&unpacked.join("index.json"));
    assert_eq!(index["manifests"][0]["digest"], image.digest.as_str());
    assert_eq!(
        index["manifests"][0]["annotations"]["io.containerd.image.name"],
        name.as_str(),
        "containerd (kind's nodes) imports it under that name"
    );
    assert!(unpacked.join("oci-layout").is_file(), "an OCI layout too");
}
