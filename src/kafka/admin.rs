//! Topic creation. Brokers without auto-creation (and careful operators)
//! need the topics made explicitly; existing topics are left as they are.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

use super::{client_config, KafkaError};

/// Creates each topic that does not exist yet.
pub fn ensure_topics(
    kafka: &BTreeMap<String, String>,
    topics: &[&str],
    partitions: i32,
    replication: i32,
) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> =
        client_config(&[], kafka, &[]).create().map_err(KafkaError::client("creating the admin client"))?;
    let new: Vec<NewTopic> =
        topics.iter().map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication))).collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results =
        futures::executor::block_on(admin.create_topics(&new, &opts)).map_err(KafkaError::client("creating topics"))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(KafkaError::Refused { context: format!("creating topic {topic}"), code }),
        }
    }
    Ok(())
}
