//! Topic creation. Brokers without auto-creation (and careful operators)
//! need the topics made explicitly; existing topics are left as they are.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

use super::watermarks::Watermarks;
use super::{client_config, KafkaError};

/// Creates each topic that does not exist yet.
pub fn ensure_topics(
    kafka: &BTreeMap<String, String>,
    topics: &[&str],
    partitions: i32,
    replication: i32,
) -> Result<(), KafkaError> {
    create(kafka, topics.iter().map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication))).collect())?;
    Ok(())
}

/// Creates the state changelog `changelog` of input topic `input` when it
/// does not exist: compacted (the latest value of each key is the state),
/// with as many partitions as the input (changelog partition = input
/// partition). An existing changelog with fewer partitions than the input
/// is refused: the state of the partitions beyond would have nowhere to go.
/// `marks` answers the metadata queries. Returns whether this call created
/// it (then it holds nothing yet).
pub fn ensure_changelog(
    kafka: &BTreeMap<String, String>,
    marks: &Watermarks,
    changelog: &str,
    input: &str,
    replication: i32,
) -> Result<bool, KafkaError> {
    let partitions = marks.partition_count(input)?;
    let new = NewTopic::new(changelog, partitions as i32, TopicReplication::Fixed(replication))
        .set("cleanup.policy", "compact");
    let created = create_missing(kafka, marks, vec![new])? > 0;
    let has = marks.partition_count(changelog)?;
    if has < partitions {
        return Err(KafkaError::ChangelogPartitions { changelog: changelog.to_owned(), has, input: partitions });
    }
    Ok(created)
}

/// Creates `topic` compacted with `partitions` when it does not exist
/// (the fleet topic: the latest value of each key is what counts).
pub fn ensure_compacted(
    kafka: &BTreeMap<String, String>,
    topic: &str,
    partitions: i32,
    replication: i32,
) -> Result<(), KafkaError> {
    create(
        kafka,
        vec![NewTopic::new(topic, partitions, TopicReplication::Fixed(replication)).set("cleanup.policy", "compact")],
    )?;
    Ok(())
}

/// Creates the topics of `new` that do not exist; how many it created.
///
/// Only the missing ones are asked for: Kafka answers a CreateTopics of an
/// existing topic with TOPIC_AUTHORIZATION_FAILED when the principal lacks
/// the Create right, so a deployment on pre-created topics would need a
/// right it never uses. Returns once every topic it created shows in the
/// broker's metadata: Kafka answers CreateTopics once its controller has
/// the topic, and a metadata request right after may still not list it.
fn create(kafka: &BTreeMap<String, String>, new: Vec<NewTopic<'_>>) -> Result<usize, KafkaError> {
    let marks = Watermarks::new(kafka)?;
    let created = create_missing(kafka, &marks, new);
    super::drop_in_background(marks);
    created
}

/// [`create`] with the metadata queries on `marks`.
fn create_missing(
    kafka: &BTreeMap<String, String>,
    marks: &Watermarks,
    new: Vec<NewTopic<'_>>,
) -> Result<usize, KafkaError> {
    let missing = new.iter().map(|t| marks.exists(t.name).map(|e| !e)).collect::<Result<Vec<bool>, _>>()?;
    let new: Vec<NewTopic<'_>> = new.into_iter().zip(missing).filter_map(|(t, m)| m.then_some(t)).collect();
    if new.is_empty() {
        return Ok(0);
    }
    let admin: AdminClient<DefaultClientContext> =
        client_config(&[], kafka, &[]).create().map_err(KafkaError::client("creating the admin client"))?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results =
        futures::executor::block_on(admin.create_topics(&new, &opts)).map_err(KafkaError::client("creating topics"))?;
    super::drop_in_background(admin);
    let mut created = Vec::new();
    for r in results {
        match r {
            Ok(topic) => created.push(topic),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, RDKafkaErrorCode::TopicAuthorizationFailed)) => {
                return Err(KafkaError::NotAuthorized {
                    topic,
                    operation: "Create",
                    purpose: "create it (it does not exist; or create it beforehand)".into(),
                })
            }
            Err((topic, code)) => return Err(KafkaError::Refused { context: format!("creating topic {topic}"), code }),
        }
    }
    let until = Instant::now() + VISIBLE_WITHIN;
    for topic in &created {
        while !marks.exists(topic)? {
            if Instant::now() >= until {
                return Err(KafkaError::Timeout(format!(
                    "topic {topic} was created but the broker's metadata did not list it within {VISIBLE_WITHIN:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50)); // polling interval
        }
    }
    Ok(created.len())
}

/// How long a created topic may take to show in the broker's metadata.
const VISIBLE_WITHIN: Duration = Duration::from_secs(30);
