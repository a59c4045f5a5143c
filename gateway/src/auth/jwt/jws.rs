//! Compact JWS (RFC 7515) as an OIDC ID token arrives: `header.payload.signature`, each part
//! base64url without padding. Parsing here trusts nothing: the payload is read before the
//! signature is checked only to pick the authenticator by `iss` (as kube's `untrustedIssuer`
//! does), and [`Jws::verify`] is the only way to its claims as verified.
//!
//! Signatures are checked with `ring` (already the TLS provider), for the families kube accepts
//! that ring verifies: RS256/384/512, PS256/384/512, ES256, ES384. `none`, HMAC and ES512 are
//! refused (kube accepts ES512; ring has no P-521).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::{Map, Value};

/// A token longer than this is not looked at (headers are bounded before this too).
pub const MAX_TOKEN_BYTES: usize = 64 * 1024;

/// The signing algorithms accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
    Es256,
    Es384,
}

impl Algorithm {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "RS256" => Self::Rs256,
            "RS384" => Self::Rs384,
            "RS512" => Self::Rs512,
            "PS256" => Self::Ps256,
            "PS384" => Self::Ps384,
            "PS512" => Self::Ps512,
            "ES256" => Self::Es256,
            "ES384" => Self::Es384,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Rs256 => "RS256",
            Self::Rs384 => "RS384",
            Self::Rs512 => "RS512",
            Self::Ps256 => "PS256",
            Self::Ps384 => "PS384",
            Self::Ps512 => "PS512",
            Self::Es256 => "ES256",
            Self::Es384 => "ES384",
        }
    }
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crit: Option<Value>,
}

/// A parsed, not yet verified token.
pub struct Jws<'a> {
    pub algorithm: Algorithm,
    pub kid: Option<String>,
    signing_input: &'a str,
    signature: Vec<u8>,
    claims: Map<String, Value>,
}

/// The claims' `iss` before anything is verified, or `None` for what is not a compact JWT
/// (kube's `untrustedIssuer`: such a token is not this authenticator's to judge).
pub fn untrusted_issuer(token: &str) -> Option<String> {
    if token.len() > MAX_TOKEN_BYTES || token.trim_start().starts_with('{') {
        return None;
    }
    let mut parts = token.split('.');
    let (_, payload, _, None) = (parts.next()?, parts.next()?, parts.next()?, parts.next()) else {
        return None;
    };
    #[derive(Deserialize)]
    struct Iss {
        #[serde(default)]
        iss: Option<String>,
    }
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    let iss = serde_json::from_slice::<Iss>(&bytes).ok()?.iss?;
    // kube coalesces Google's legacy issuer.
    Some(if iss == "accounts.google.com" {
        "https://accounts.google.com".to_owned()
    } else {
        iss
    })
}

impl<'a> Jws<'a> {
    pub fn parse(token: &'a str) -> Result<Self, String> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(format!("token longer than {MAX_TOKEN_BYTES} bytes"));
        }
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("malformed jwt: expected 3 parts".into());
        };
        let decode = |part: &str, what: &str| {
            URL_SAFE_NO_PAD
                .decode(part)
                .map_err(|e| format!("malformed jwt {what}: {e}"))
        };
        let header: Header = serde_json::from_slice(&decode(header, "header")?)
            .map_err(|e| format!("malformed jwt header: {e}"))?;
        if header.crit.is_some() {
            return Err("unsupported critical header".into());
        }
        let algorithm = Algorithm::from_name(&header.alg)
            .ok_or_else(|| format!("unsupported signing algorithm {:?}", header.alg))?;
        let claims: Map<String, Value> = serde_json::from_slice(&decode(payload, "payload")?)
            .map_err(|e| format!("malformed jwt claims: {e}"))?;
        let signing_input = &token[..token.len() - signature.len() - 1];
        Ok(Self {
            algorithm,
            kid: header.kid,
            signing_input,
            signature: decode(signature, "signature")?,
            claims,
        })
    }

    /// The claims, once `key` verified the signature.
    pub fn verify(&self, key: &PublicKey) -> Option<&Map<String, Value>> {
        key.verify(
            self.algorithm,
            self.signing_input.as_bytes(),
            &self.signature,
        )
        .then_some(&self.claims)
    }
}

/// One verification key from a JWKS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub kid: Option<String>,
    /// The JWK's `alg`, when it pins one.
    pub alg: Option<String>,
    pub material: KeyMaterial,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyMaterial {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// The uncompressed point (`0x04 || x || y`) on P-256 or P-384.
    Ec {
        p384: bool,
        point: Vec<u8>,
    },
}

impl PublicKey {
    fn verify(&self, algorithm: Algorithm, message: &[u8], signature: &[u8]) -> bool {
        if self.alg.as_deref().is_some_and(|a| a != algorithm.name()) {
            return false;
        }
        use Algorithm as A;
        match (&self.material, algorithm) {
            (KeyMaterial::Rsa { n, e }, _) => {
                let params = match algorithm {
                    A::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    A::Rs384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    A::Rs512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    A::Ps256 => &signature::RSA_PSS_2048_8192_SHA256,
                    A::Ps384 => &signature::RSA_PSS_2048_8192_SHA384,
                    A::Ps512 => &signature::RSA_PSS_2048_8192_SHA512,
                    A::Es256 | A::Es384 => return false,
                };
                RsaPublicKeyComponents { n, e }
                    .verify(params, message, signature)
                    .is_ok()
            }
            (KeyMaterial::Ec { p384: false, point }, A::Es256) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, signature)
                    .is_ok()
            }
            (KeyMaterial::Ec { p384: true, point }, A::Es384) => {
                UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                    .verify(message, signature)
                    .is_ok()
            }
            (KeyMaterial::Ec { .. }, _) => false,
        }
    }
}

/// A JWKS document's keys that can verify signatures; keys of other types, of `use: enc`, or
/// malformed are skipped, as go-jose skips what it cannot use.
pub fn parse_key_set(body: &[u8]) -> Result<Vec<PublicKey>, String> {
    #[derive(Deserialize)]
    struct KeySet {
        keys: Vec<Jwk>,
    }
    #[derive(Deserialize)]
    struct Jwk {
        kty: String,
        #[serde(default)]
        kid: Option<String>,
        #[serde(default, rename = "use")]
        usage: Option<String>,
        #[serde(default)]
        alg: Option<String>,
        #[serde(default)]
        n: Option<String>,
        #[serde(default)]
        e: Option<String>,
        #[serde(default)]
        crv: Option<String>,
        #[serde(default)]
        x: Option<String>,
        #[serde(default)]
        y: Option<String>,
    }
    let set: KeySet =
        serde_json::from_slice(body).map_err(|e| format!("failed to decode keys: {e}"))?;
    let b64 = |v: &Option<String>| v.as_deref().and_then(|s| URL_SAFE_NO_PAD.decode(s).ok());
    let keys = set
        .keys
        .into_iter()
        .filter(|k| k.usage.as_deref().is_none_or(|u| u == "sig"))
        .filter_map(|k| {
            let material = match (k.kty.as_str(), k.crv.as_deref()) {
                ("RSA", _) => KeyMaterial::Rsa {
                    n: b64(&k.n)?,
                    e: b64(&k.e)?,
                },
                ("EC", Some(crv @ ("P-256" | "P-384"))) => {
                    let (x, y) = (b64(&k.x)?, b64(&k.y)?);
                    let size = if crv == "P-256" { 32 } else { 48 };
                    if x.len() != size || y.len() != size {
                        return None;
                    }
                    let mut point = Vec::with_capacity(1 + 2 * size);
                    point.push(4);
                    point.extend_from_slice(&x);
                    point.extend_from_slice(&y);
                    KeyMaterial::Ec {
                        p384: crv == "P-384",
                        point,
                    }
                }
                _ => return None,
            };
            Some(PublicKey {
                kid: k.kid,
                alg: k.alg,
                material,
            })
        })
        .collect();
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

    fn es256_token(claims: &Value, kid: &str) -> (String, Vec<PublicKey>) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let header = serde_json::json!({"alg": "ES256", "kid": kid});
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = pair.sign(&rng, input.as_bytes()).unwrap();
        let point = pair.public_key().as_ref();
        let jwks = serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])}]});
        let keys = parse_key_set(jwks.to_string().as_bytes()).unwrap();
        (
            format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref())),
            keys,
        )
    }

    #[test]
    fn a_signed_token_verifies_with_its_key_only() {
        let claims = serde_json::json!({"iss": "https://issuer", "sub": "alice"});
        let (token, keys) = es256_token(&claims, "k1");
        let (_, other) = es256_token(&claims, "k1");
        let jws = Jws::parse(&token).unwrap();
        assert_eq!(jws.kid.as_deref(), Some("k1"));
        assert_eq!(jws.verify(&keys[0]).unwrap()["sub"], "alice");
        assert!(
            jws.verify(&other[0]).is_none(),
            "another key must not verify it"
        );
        assert_eq!(untrusted_issuer(&token).as_deref(), Some("https://issuer"));
        // A changed payload breaks the signature.
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(r#"{"iss":"https://issuer","sub":"root"}"#);
        parts[1] = &forged;
        let forged = parts.join(".");
        assert!(Jws::parse(&forged).unwrap().verify(&keys[0]).is_none());
    }

    #[test]
    fn none_and_hmac_are_refused() {
        for alg in ["none", "HS256", "ES512"] {
            let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"{alg}"}}"#));
            let token = format!("{header}.{}.", URL_SAFE_NO_PAD.encode("{}"));
            let err = Jws::parse(&token).err().unwrap();
            assert!(
                err.contains("unsupported signing algorithm"),
                "{alg}: {err}"
            );
        }
        assert!(Jws::parse("a.b").is_err());
        assert!(untrusted_issuer("{\"iss\":\"x\"}").is_none());
    }
}
