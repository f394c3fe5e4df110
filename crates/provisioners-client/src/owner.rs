//! [`OwnerKeys`]: the key that authenticates ownership stamps, and where
//! it lives.
//!
//! Give the keys to a tree with
//! [`Context::with_extension`](provisioners_core::Context::with_extension);
//! leaves that stamp what they write (manifests, helm records) read them
//! with [`OwnerKeys::of`]:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use provisioners_core::Context;
//! use provisioners_client::owner::OwnerKeys;
//!
//! let cx = Context::offline().with_extension(OwnerKeys::new(vec![7; 32]).unwrap());
//! assert!(OwnerKeys::of(&cx).is_some());
//! # }
//! ```

use std::time::{Duration, SystemTime};

use provisioners_core::{Context, Error, Result};

/// How long after the owner key Secret was created data written before it
/// without an authenticator is adopted (see [`OwnerKeys::adopts_unsigned`]):
/// the first passes after keys are turned on sign what the operator wrote
/// before, and after this nothing unsigned is adopted any more.
pub const ADOPTION_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// The secret that authenticates what the operator writes for its owners:
/// ownership stamps carry an HMAC-SHA256 over owner, node and the object's
/// identity, keyed by it, so a tenant who can patch an object (but cannot
/// read the key) cannot make it look like ours.
///
/// It holds the current key, which signs, and optionally the previous one,
/// which still verifies, so a rotation never makes our own objects foreign.
/// It lives in a Secret in the operator's namespace (see
/// [`OwnerKeys::load_or_create`]), readable by the operator only; its
/// value never appears in `Debug`, logs or errors.
///
/// ```
/// use provisioners_client::owner::OwnerKeys;
///
/// let old = OwnerKeys::new(vec![7; 32]).unwrap();
/// let mac = old.sign(&["owner", "node", "v1/ConfigMap/ns/a"]);
/// assert!(old.verify(&["owner", "node", "v1/ConfigMap/ns/a"], &mac));
/// assert!(!old.verify(&["owner", "node", "v1/ConfigMap/ns/b"], &mac));
/// // After a rotation the previous key still verifies what it signed.
/// let new = OwnerKeys::new(vec![9; 32]).unwrap().with_previous(vec![7; 32]);
/// assert!(new.verify(&["owner", "node", "v1/ConfigMap/ns/a"], &mac));
/// assert_ne!(new.sign(&["owner", "node", "v1/ConfigMap/ns/a"]), mac);
/// ```
#[derive(Clone)]
pub struct OwnerKeys {
    current: Vec<u8>,
    previous: Option<Vec<u8>>,
    created: Option<SystemTime>,
}

/// The shortest key accepted: HMAC-SHA256's block of security.
pub const OWNER_KEY_MIN_LEN: usize = 32;

/// The data key of the current key in the Secret [`OwnerKeys`] live in.
const CURRENT: &str = "current";
/// The data key of the previous key (after a rotation).
const PREVIOUS: &str = "previous";

use hmac::Mac as _;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

impl OwnerKeys {
    /// The keys given to `cx`'s tree with
    /// [`Context::with_extension`](provisioners_core::Context::with_extension),
    /// if any: without them, stamps are not authenticated.
    pub fn of(cx: &Context) -> Option<&OwnerKeys> {
        cx.extension::<OwnerKeys>()
    }

    /// Keys that sign with `current`; an `Invalid` error when it is
    /// shorter than [`OWNER_KEY_MIN_LEN`] bytes.
    pub fn new(current: impl Into<Vec<u8>>) -> Result<Self> {
        let current = current.into();
        if current.len() < OWNER_KEY_MIN_LEN {
            return Err(Error::invalid(format!(
                "the owner key is {} bytes long; use at least {OWNER_KEY_MIN_LEN} random bytes \
                 (OwnerKeys::generate makes one)",
                current.len()
            )));
        }
        Ok(OwnerKeys {
            current,
            previous: None,
            created: None,
        })
    }

    /// Fresh random keys, from the operating system's generator.
    pub fn generate() -> Result<Self> {
        Ok(OwnerKeys {
            current: random_key()?,
            previous: None,
            created: None,
        })
    }

    /// Also accepts what `previous` signed (the key before a rotation).
    #[must_use]
    pub fn with_previous(mut self, previous: impl Into<Vec<u8>>) -> Self {
        let previous = previous.into();
        self.previous = (!previous.is_empty()).then_some(previous);
        self
    }

    /// Says when the keys were first made (the `creationTimestamp` the API
    /// server gave their Secret; [`OwnerKeys::load_or_create`] sets it).
    /// Data written before then carries no authenticator, and is adopted
    /// during the [`ADOPTION_WINDOW`] after it (see
    /// [`OwnerKeys::adopts_unsigned`]).
    #[must_use]
    pub fn with_created(mut self, created: SystemTime) -> Self {
        self.created = Some(created);
        self
    }

    /// When the keys were first made, if known (see [`OwnerKeys::with_created`]).
    pub fn created(&self) -> Option<SystemTime> {
        self.created
    }

    /// Whether data that carries no authenticator, and that the API server
    /// says was created at `written` (a `creationTimestamp`, which no
    /// client can set), is adopted as ours: it was created before the keys
    /// existed, and the keys are at most [`ADOPTION_WINDOW`] old. Anything
    /// unsigned created after the keys (a forgery) or met after the window
    /// is refused, as always. Keys without a [creation time](OwnerKeys::with_created)
    /// adopt nothing.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use provisioners_client::owner::OwnerKeys;
    ///
    /// let now = SystemTime::now();
    /// let keys = OwnerKeys::new(vec![7; 32]).unwrap().with_created(now);
    /// assert!(keys.adopts_unsigned(now - Duration::from_secs(60)));
    /// assert!(!keys.adopts_unsigned(now + Duration::from_secs(1)));
    /// assert!(!OwnerKeys::new(vec![7; 32]).unwrap().adopts_unsigned(now));
    /// ```
    pub fn adopts_unsigned(&self, written: SystemTime) -> bool {
        self.adopts_unsigned_at(written, SystemTime::now())
    }

    /// Whether the keys are still within the [`ADOPTION_WINDOW`] after they
    /// were [created](OwnerKeys::with_created), when data older than them
    /// that carries no authenticator is adopted.
    pub fn adopting(&self) -> bool {
        self.adopting_at(SystemTime::now())
    }

    fn adopting_at(&self, now: SystemTime) -> bool {
        self.created.is_some_and(|created| {
            now.duration_since(created)
                .map_or(true, |age| age <= ADOPTION_WINDOW)
        })
    }

    fn adopts_unsigned_at(&self, written: SystemTime, now: SystemTime) -> bool {
        self.adopting_at(now) && self.created.is_some_and(|created| written < created)
    }

    /// The authenticator of `fields` with the current key, hex-encoded.
    /// Each field is length-prefixed, so no two lists of fields sign alike.
    pub fn sign(&self, fields: &[&str]) -> String {
        let mac = mac(&self.current, fields).finalize().into_bytes();
        hex::encode(mac)
    }

    /// Whether `mac` authenticates `fields` under the current or the
    /// previous key (compared in constant time).
    pub fn verify(&self, fields: &[&str], mac: &str) -> bool {
        let Some(bytes) = unhex(mac) else {
            return false;
        };
        std::iter::once(&self.current)
            .chain(self.previous.as_ref())
            .any(|key| self::mac(key, fields).verify_slice(&bytes).is_ok())
    }

    /// The keys stored in the Secret `namespace/name`, creating it with a
    /// fresh random key when it does not exist (a concurrent creator wins
    /// and its key is read back). The Secret should live in the operator's
    /// own namespace, where no tenant can read it. The keys carry the
    /// Secret's `creationTimestamp` (see [`OwnerKeys::adopts_unsigned`]).
    pub async fn load_or_create(
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<Self> {
        let api = secrets(client, namespace);
        let read = |e| {
            Error::kube(
                format_args!("reading the owner key Secret {namespace}/{name}"),
                e,
            )
        };
        if let Some(secret) = api.get_opt(name).await.map_err(read)? {
            return keys_of(&secret, namespace, name);
        }
        let keys = OwnerKeys::generate()?;
        match api
            .create(&kube::api::PostParams::default(), &keys.to_secret(name)?)
            .await
        {
            Ok(secret) => {
                let created = secret
                    .metadata
                    .creation_timestamp
                    .map_or_else(SystemTime::now, |t| SystemTime::from(t.0));
                tracing::info!(secret = %format_args!("{namespace}/{name}"), "created the owner key Secret");
                Ok(keys.with_created(created))
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let secret = api.get(name).await.map_err(read)?;
                keys_of(&secret, namespace, name)
            }
            Err(e) => Err(Error::kube(
                format_args!("creating the owner key Secret {namespace}/{name}"),
                e,
            )),
        }
    }

    /// Rotates the keys in the Secret `namespace/name`: a fresh key signs
    /// from now on, the current one becomes the previous (still verifying),
    /// and the previous one is dropped. Run it no more often than every
    /// object is re-applied (one provision of every owner), or objects
    /// stamped two rotations ago become unverifiable (kept, never deleted).
    pub async fn rotate(client: &kube::Client, namespace: &str, name: &str) -> Result<Self> {
        let api = secrets(client, namespace);
        let secret = api.get(name).await.map_err(|e| {
            Error::kube(
                format_args!("reading the owner key Secret {namespace}/{name}"),
                e,
            )
        })?;
        let old = keys_of(&secret, namespace, name)?;
        let mut keys = OwnerKeys::generate()?.with_previous(old.current);
        keys.created = old.created;
        let mut next = keys.to_secret(name)?;
        // Replaced only if nobody rotated meanwhile.
        next.metadata.resource_version = secret.metadata.resource_version.clone();
        api.replace(name, &kube::api::PostParams::default(), &next)
            .await
            .map_err(|e| {
                Error::kube(
                    format_args!("rotating the owner key Secret {namespace}/{name}"),
                    e,
                )
            })?;
        Ok(keys)
    }

    fn to_secret(&self, name: &str) -> Result<kube::api::DynamicObject> {
        use base64::Engine as _;
        let encode = |key: &[u8]| base64::engine::general_purpose::STANDARD.encode(key);
        let mut data = serde_json::Map::new();
        data.insert(CURRENT.into(), encode(&self.current).into());
        if let Some(previous) = &self.previous {
            data.insert(PREVIOUS.into(), encode(previous).into());
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": name },
            "type": "Opaque",
            "data": data,
        }))
        .map_err(|e| Error::invalid(format!("encoding the owner key Secret {name}: {e}")))
    }
}

impl std::fmt::Debug for OwnerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerKeys")
            .field("previous", &self.previous.is_some())
            .field("created", &self.created)
            .finish_non_exhaustive()
    }
}

fn mac(key: &[u8], fields: &[&str]) -> HmacSha256 {
    use hmac::KeyInit as _;
    // HMAC takes keys of any length; this never fails.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of any length"),
    };
    for field in fields {
        mac.update(&(field.len() as u64).to_be_bytes());
        mac.update(field.as_bytes());
    }
    mac
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

fn random_key() -> Result<Vec<u8>> {
    let mut key = vec![0; OWNER_KEY_MIN_LEN];
    getrandom::fill(&mut key).map_err(|e| {
        Error::unavailable(format!(
            "the operating system gave no random bytes for the owner key: {e}"
        ))
    })?;
    Ok(key)
}

fn secrets(client: &kube::Client, namespace: &str) -> kube::Api<kube::api::DynamicObject> {
    let resource = kube::api::ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Secret".into(),
        plural: "secrets".into(),
    };
    kube::Api::namespaced_with(client.clone(), namespace, &resource)
}

/// The keys in `secret`; an `Invalid` error naming the Secret and the
/// data key when one is missing or unusable (never its value).
fn keys_of(secret: &kube::api::DynamicObject, namespace: &str, name: &str) -> Result<OwnerKeys> {
    use base64::Engine as _;
    let field = |key: &str| -> Result<Option<Vec<u8>>> {
        let Some(value) = secret.data.get("data").and_then(|d| d.get(key)) else {
            return Ok(None);
        };
        value
            .as_str()
            .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
            .map(Some)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "the owner key Secret {namespace}/{name} has a `{key}` entry that is not \
                     base64; delete the Secret to have a new key made (objects stamped with the \
                     old one will then be kept, never deleted)"
                ))
            })
    };
    let current = field(CURRENT)?.ok_or_else(|| {
        Error::invalid(format!(
            "the owner key Secret {namespace}/{name} has no `{CURRENT}` entry; delete it to have \
             a new key made"
        ))
    })?;
    let keys = OwnerKeys::new(current).map_err(|_| {
        Error::invalid(format!(
            "the owner key in Secret {namespace}/{name} (`{CURRENT}`) is shorter than \
             {OWNER_KEY_MIN_LEN} bytes; delete the Secret to have a new key made"
        ))
    })?;
    let keys = match field(PREVIOUS)? {
        Some(previous) => keys.with_previous(previous),
        None => keys,
    };
    Ok(match &secret.metadata.creation_timestamp {
        Some(created) => keys.with_created(SystemTime::from(created.0)),
        None => keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_length_prefixed_and_short_keys_refused() {
        let keys = OwnerKeys::new(vec![1; 32]).unwrap();
        assert_ne!(keys.sign(&["ab", "c"]), keys.sign(&["a", "bc"]));
        assert!(!keys.verify(&["ab", "c"], "zz"));
        assert!(!keys.verify(&["ab", "c"], &"é".repeat(32)));
        assert!(OwnerKeys::new(vec![1; 31]).is_err());
        assert!(!format!("{keys:?}").contains('1'));
        let generated = OwnerKeys::generate().unwrap();
        assert_ne!(
            generated.sign(&["x"]),
            OwnerKeys::generate().unwrap().sign(&["x"])
        );
    }

    #[test]
    fn only_unsigned_data_older_than_young_keys_is_adopted() {
        let created = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let keys = OwnerKeys::new(vec![1; 32]).unwrap().with_created(created);
        let before = created - Duration::from_secs(1);
        let after = created + Duration::from_secs(1);
        assert!(keys.adopts_unsigned_at(before, created + Duration::from_secs(60)));
        assert!(!keys.adopts_unsigned_at(after, created + Duration::from_secs(60)));
        assert!(!keys.adopts_unsigned_at(created, created));
        let late = created + ADOPTION_WINDOW + Duration::from_secs(1);
        assert!(!keys.adopts_unsigned_at(before, late));
        // A clock behind the Secret's creation is still within the window.
        assert!(keys.adopts_unsigned_at(before, before));
        assert!(
            !OwnerKeys::new(vec![1; 32])
                .unwrap()
                .adopts_unsigned_at(before, created)
        );
    }

    #[test]
    fn a_secret_round_trips_and_a_broken_one_is_named() {
        let keys = OwnerKeys::generate().unwrap().with_previous(vec![5; 32]);
        let secret = keys.to_secret("owner-key").unwrap();
        let back = keys_of(&secret, "ops", "owner-key").unwrap();
        assert!(back.verify(&["a"], &keys.sign(&["a"])));
        assert!(back.verify(&["a"], &OwnerKeys::new(vec![5; 32]).unwrap().sign(&["a"])));
        let mut broken = secret;
        broken.data["data"]["current"] = "not base64!".into();
        let e = keys_of(&broken, "ops", "owner-key").unwrap_err();
        assert!(e.to_string().contains("ops/owner-key"), "{e}");
        assert!(e.to_string().contains("`current`"), "{e}");
    }
}
