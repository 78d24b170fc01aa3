//! `[codec]` and `[schema_registry]`: how records are framed on the
//! topics, and the schema registry that the Confluent framing names schemas
//! in.
//!
//! Two framings of Avro exist on Kafka. Avro single-object encoding (`C3
//! 01`, the writer schema's 8-byte fingerprint, the body) carries its
//! schema's identity in the record and needs no service. The Confluent
//! framing (`00`, a 4-byte big-endian schema id, the body) is what the
//! serializers of Confluent's clients and their kin write: the id is looked
//! up in a schema registry. A platform that already runs a registry keeps
//! its producers and consumers unchanged by choosing `confluent`.
//!
//! Secrets never sit in the file: the registry's credentials are read from
//! the environment variables named here, when the process starts, so a
//! missing variable fails at start-up with the field named.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{invalid, ConfigError};
pub use crate::codec::{Framing, InputFraming};

/// `[codec]`: the framing of each side.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CodecConfig {
    /// `single_object` (the default), `confluent` or `both`.
    pub input: InputFraming,
    /// `single_object` (the default) or `confluent`: verdicts, anomalies and
    /// commands.
    pub output: Framing,
}

impl Default for CodecConfig {
    fn default() -> Self {
        CodecConfig { input: InputFraming::SingleObject, output: Framing::SingleObject }
    }
}

impl CodecConfig {
    /// Whether any side needs the registry.
    pub fn uses_registry(&self) -> bool {
        self.input.accepts(Framing::Confluent) || self.output == Framing::Confluent
    }
}

/// How the subject a topic's schema is registered under is named (the
/// Confluent serializers' `subject.name.strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SubjectNaming {
    /// `<topic>-value` (the default of every Confluent serializer).
    TopicName,
    /// The record's full name (`reconciler.v1.Verdict`).
    RecordName,
    /// `<topic>-<record full name>`.
    TopicRecordName,
}

impl SubjectNaming {
    /// The subject of the values of `topic` whose schema is `record` (a
    /// full name).
    pub fn subject(self, topic: &str, record: &str) -> String {
        match self {
            SubjectNaming::TopicName => format!("{topic}-value"),
            SubjectNaming::RecordName => record.to_owned(),
            SubjectNaming::TopicRecordName => format!("{topic}-{record}"),
        }
    }
}

/// `[schema_registry]`: a registry with the Confluent REST API (Confluent
/// Schema Registry, Apicurio Registry's `ccompat` API, Karapace, ...).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SchemaRegistryConfig {
    /// Base URL (`http://registry:8081`, or Apicurio's
    /// `http://registry:8080/apis/ccompat/v7`). Required when `[codec]`
    /// `input` is `confluent` or `both`, or `output` is `confluent`.
    pub url: String,
    /// Environment variable holding the basic-auth user name ("": none).
    pub username_env: String,
    /// Environment variable holding the basic-auth password.
    pub password_env: String,
    /// Environment variable holding a bearer token ("": none); exclusive
    /// with basic auth.
    pub token_env: String,
    /// PEM file of extra root certificates for an `https` URL (a private
    /// CA); the system's roots are always trusted.
    pub ca_file: Option<PathBuf>,
    /// `topic_name` (the default), `record_name` or `topic_record_name`.
    pub subject_naming: SubjectNaming,
    /// Register the reconciler's schemas under their subjects at start-up
    /// (the default); `false` only looks them up, for registries where
    /// schemas are registered by a pipeline of their own. Either way a
    /// schema the registry refuses stops the start.
    pub auto_register: bool,
    /// How long one request may take, in ms.
    pub timeout_ms: u64,
    /// Longest wait between retries while the registry cannot be reached,
    /// in ms (the input partition waits; records are never dead-lettered
    /// for an outage).
    pub retry_backoff_max_ms: u64,
}

impl Default for SchemaRegistryConfig {
    fn default() -> Self {
        SchemaRegistryConfig {
            url: String::new(),
            username_env: String::new(),
            password_env: String::new(),
            token_env: String::new(),
            ca_file: None,
            subject_naming: SubjectNaming::TopicName,
            auto_register: true,
            timeout_ms: 10_000,
            retry_backoff_max_ms: 10_000,
        }
    }
}

/// The registry's credentials, read from the environment.
#[derive(Clone, PartialEq, Eq)]
pub enum RegistryAuth {
    /// No credentials.
    None,
    /// HTTP basic authentication.
    Basic {
        /// User name.
        username: String,
        /// Password.
        password: String,
    },
    /// `Authorization: Bearer <token>`.
    Bearer(String),
}

impl std::fmt::Debug for RegistryAuth {
    /// Never prints a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryAuth::None => f.write_str("None"),
            RegistryAuth::Basic { username, .. } => write!(f, "Basic({username}, <password>)"),
            RegistryAuth::Bearer(_) => f.write_str("Bearer(<token>)"),
        }
    }
}

impl SchemaRegistryConfig {
    /// Checks the values serde cannot; `codec` says whether the registry is
    /// needed at all.
    pub fn validate(&self, codec: &CodecConfig) -> Result<(), ConfigError> {
        let url = self.url.trim();
        if codec.uses_registry() && url.is_empty() {
            return Err(invalid(
                "schema_registry.url",
                "is required when codec.input or codec.output is \"confluent\" (or input is \"both\")",
            ));
        }
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid("schema_registry.url", format!("{url:?} is not an http:// or https:// URL")));
        }
        if !self.token_env.is_empty() && !self.username_env.is_empty() {
            return Err(invalid("schema_registry.token_env", "use either a bearer token or basic auth, not both"));
        }
        if self.username_env.is_empty() != self.password_env.is_empty() {
            return Err(invalid("schema_registry.password_env", "basic auth needs both username_env and password_env"));
        }
        for (field, v) in [
            ("schema_registry.timeout_ms", self.timeout_ms),
            ("schema_registry.retry_backoff_max_ms", self.retry_backoff_max_ms),
        ] {
            if v == 0 {
                return Err(invalid(field, "must be positive"));
            }
        }
        Ok(())
    }

    /// The credentials, read from the named variables now; an error naming
    /// the field when a variable is unset.
    pub fn auth(&self) -> Result<RegistryAuth, ConfigError> {
        let read = |field: &str, var: &str| {
            std::env::var(var).map_err(|_| invalid(field, format!("the environment variable {var} is not set")))
        };
        if !self.token_env.is_empty() {
            return Ok(RegistryAuth::Bearer(read("schema_registry.token_env", &self.token_env)?));
        }
        if !self.username_env.is_empty() {
            return Ok(RegistryAuth::Basic {
                username: read("schema_registry.username_env", &self.username_env)?,
                password: read("schema_registry.password_env", &self.password_env)?,
            });
        }
        Ok(RegistryAuth::None)
    }

    /// The PEM roots of `ca_file`, read now; an error naming the field.
    pub fn ca_pem(&self) -> Result<Option<Vec<u8>>, ConfigError> {
        match &self.ca_file {
            None => Ok(None),
            Some(p) => std::fs::read(p)
                .map(Some)
                .map_err(|e| invalid("schema_registry.ca_file", format!("{}: {e}", p.display()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_confluent_strategies() {
        let r = "reconciler.v1.Verdict";
        assert_eq!(SubjectNaming::TopicName.subject("ops.verdicts", r), "ops.verdicts-value");
        assert_eq!(SubjectNaming::RecordName.subject("ops.verdicts", r), r);
        assert_eq!(SubjectNaming::TopicRecordName.subject("ops.verdicts", r), "ops.verdicts-reconciler.v1.Verdict");
    }

    #[test]
    fn confluent_without_a_url_is_refused_with_the_field_named() {
        let codec = CodecConfig { input: InputFraming::Both, output: Framing::SingleObject };
        let e = SchemaRegistryConfig::default().validate(&codec).unwrap_err().to_string();
        assert!(e.contains("schema_registry.url"), "{e}");
        assert!(SchemaRegistryConfig::default().validate(&CodecConfig::default()).is_ok());
        let bad = SchemaRegistryConfig { url: "registry:8081".into(), ..Default::default() };
        assert!(bad.validate(&codec).unwrap_err().to_string().contains("not an http"));
    }

    #[test]
    fn a_missing_credential_variable_is_named() {
        let c = SchemaRegistryConfig {
            url: "http://r".into(),
            token_env: "RECONCILER_TEST_NO_SUCH_TOKEN_VAR".into(),
            ..Default::default()
        };
        let e = c.auth().unwrap_err().to_string();
        assert!(e.contains("schema_registry.token_env") && e.contains("RECONCILER_TEST_NO_SUCH_TOKEN_VAR"), "{e}");
        assert_eq!(format!("{:?}", RegistryAuth::Bearer("secret".into())), "Bearer(<token>)");
    }
}
