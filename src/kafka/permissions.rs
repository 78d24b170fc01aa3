//! The start-up check of the topic rights the reconciler needs.
//!
//! On a cluster with an authorizer, a principal that may not write an
//! output topic would otherwise learn it at its first verdict, after the
//! group has handed it partitions; one that may not read the changelog,
//! at its first restore. Here the broker is asked up front which
//! operations this client's principal may perform on each topic (Kafka's
//! DescribeTopics with `include_authorized_operations`, KIP-430), and a
//! missing one stops the start with the topic, the operation and what it
//! is needed for.
//!
//! A broker without an authorizer allows everything and says so; a broker
//! that does not report authorized operations (older Kafka, some other
//! Kafka-protocol implementations) leaves the check undecided, and the
//! rights are then found out by use, as before.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use super::{client_config, KafkaError};

/// A Kafka ACL operation on a topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Fetch its records (the input, the changelog, the fleet).
    Read,
    /// Produce to it (outputs, timers into the input, the changelog).
    Write,
    /// See it and its partitions (every topic; implied by Read and Write).
    Describe,
}

impl Operation {
    /// As `kafka-acls --operation` names it.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Read => "Read",
            Operation::Write => "Write",
            Operation::Describe => "Describe",
        }
    }

    fn code(self) -> u32 {
        (match self {
            Operation::Read => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_READ,
            Operation::Write => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_WRITE,
            Operation::Describe => rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_DESCRIBE,
        }) as u32
    }
}

/// What the reconciler needs on one topic, and what for.
#[derive(Clone, Debug)]
pub struct Need {
    /// The topic.
    pub topic: String,
    /// The operations it needs there, the one that matters most first.
    pub operations: Vec<Operation>,
    /// What for, in the words of the error that names a missing one.
    pub purpose: &'static str,
}

/// What the broker said of one topic.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    /// The operations the principal may perform (ACL operation codes).
    Allowed(Vec<u32>),
    /// The principal may not even describe the topic.
    NotDescribable,
    /// No answer about rights: the topic is unknown, or the broker does not
    /// report authorized operations.
    Undecided,
}

/// How long the broker has to answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Fails with [`KafkaError::NotAuthorized`] for the first operation of
/// `needs` that the broker says this client's principal may not perform.
/// `Ok` when every one is allowed or the broker does not say (a topic that
/// does not exist yet is not checked: whoever creates it grants its rights).
pub fn check(kafka: &BTreeMap<String, String>, needs: &[Need]) -> Result<(), KafkaError> {
    if needs.is_empty() {
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = client_config(&[], kafka, &[])
        .create()
        .map_err(KafkaError::client("creating the permission check's client"))?;
    let topics: Vec<&str> = needs.iter().map(|n| n.topic.as_str()).collect();
    let answers = describe(&admin, &topics);
    super::drop_in_background(admin);
    let answers = match answers {
        Some(a) => a,
        None => {
            tracing::debug!("The broker did not report topic rights; they are found out by use");
            return Ok(());
        }
    };
    first_missing(needs, &answers)
}

/// The first need that `answers` refuse.
fn first_missing(needs: &[Need], answers: &BTreeMap<String, Answer>) -> Result<(), KafkaError> {
    for need in needs {
        let refused = |operation: Operation| KafkaError::NotAuthorized {
            topic: need.topic.clone(),
            operation: operation.name(),
            purpose: need.purpose.to_owned(),
        };
        match answers.get(&need.topic) {
            // Read and Write imply Describe: granting the first needed
            // operation is what lets it see the topic too.
            Some(Answer::NotDescribable) => return Err(refused(need.operations[0])),
            Some(Answer::Allowed(ops)) => {
                if let Some(op) = need.operations.iter().find(|op| !ops.contains(&op.code())) {
                    return Err(refused(*op));
                }
            }
            Some(Answer::Undecided) | None => {}
        }
    }
    Ok(())
}

/// DescribeTopics with authorized operations for `topics`, through
/// librdkafka's C API (the Rust client does not wrap it). `None` when the
/// request as a whole failed or timed out.
fn describe(admin: &AdminClient<DefaultClientContext>, topics: &[&str]) -> Option<BTreeMap<String, Answer>> {
    let names: Vec<CString> = topics.iter().filter_map(|t| CString::new(*t).ok()).collect();
    let mut ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let rk = admin.inner().native_ptr();
    // SAFETY: every handle is created, used and destroyed here, on this
    // thread; `names` outlives the collection built from its pointers
    // (librdkafka copies them), and the result's descriptions are read
    // before the event that owns them is destroyed.
    unsafe {
        let collection = rd::rd_kafka_TopicCollection_of_topic_names(ptrs.as_mut_ptr(), ptrs.len());
        let options = rd::rd_kafka_AdminOptions_new(rk, rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS);
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options,
            TIMEOUT.as_millis() as i32,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        let err = rd::rd_kafka_AdminOptions_set_include_authorized_operations(options, 1);
        if !err.is_null() {
            rd::rd_kafka_error_destroy(err);
        }
        let queue = rd::rd_kafka_queue_new(rk);
        rd::rd_kafka_DescribeTopics(rk, collection, options, queue);
        let event = rd::rd_kafka_queue_poll(queue, (TIMEOUT.as_millis() + 2_000) as i32);
        let answers = if event.is_null() { None } else { read_result(event) };
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_queue_destroy(queue);
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_TopicCollection_destroy(collection);
        answers
    }
}

/// The answers of a DescribeTopics result event.
///
/// # Safety
/// `event` is a live DescribeTopics result event.
unsafe fn read_result(event: *mut rd::rd_kafka_event_t) -> Option<BTreeMap<String, Answer>> {
    if rd::rd_kafka_event_error(event) != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        let why = CStr::from_ptr(rd::rd_kafka_event_error_string(event)).to_string_lossy().into_owned();
        tracing::debug!(error = %why, "The broker did not describe the topics");
        return None;
    }
    let result = rd::rd_kafka_event_DescribeTopics_result(event);
    if result.is_null() {
        return None;
    }
    let mut count = 0usize;
    let descriptions = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
    let mut answers = BTreeMap::new();
    for i in 0..count {
        let d = *descriptions.add(i);
        let name = CStr::from_ptr(rd::rd_kafka_TopicDescription_name(d)).to_string_lossy().into_owned();
        let error = rd::rd_kafka_TopicDescription_error(d);
        let code = if error.is_null() {
            RDKafkaErrorCode::NoError
        } else {
            RDKafkaErrorCode::from(rd::rd_kafka_error_code(error))
        };
        let answer = match code {
            RDKafkaErrorCode::NoError => {
                let mut n = 0usize;
                let ops = rd::rd_kafka_TopicDescription_authorized_operations(d, &mut n);
                if ops.is_null() || n == 0 {
                    Answer::Undecided
                } else {
                    // Read as plain codes: an operation newer than these
                    // bindings must not be read as an enum.
                    let codes = std::slice::from_raw_parts(ops as *const u32, n);
                    Answer::Allowed(codes.to_vec())
                }
            }
            RDKafkaErrorCode::TopicAuthorizationFailed => Answer::NotDescribable,
            _ => Answer::Undecided,
        };
        answers.insert(name, answer);
    }
    Some(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(topic: &str, operations: &[Operation]) -> Need {
        Need { topic: topic.into(), operations: operations.to_vec(), purpose: "publish verdicts" }
    }

    #[test]
    fn a_missing_operation_is_named_with_its_topic_and_purpose() {
        let answers = BTreeMap::from([
            ("in".to_owned(), Answer::Allowed(vec![Operation::Read.code(), Operation::Describe.code()])),
            ("out".to_owned(), Answer::Allowed(vec![Operation::Describe.code()])),
        ]);
        let needs = [need("in", &[Operation::Read]), need("out", &[Operation::Write, Operation::Describe])];
        let err = first_missing(&needs, &answers).unwrap_err().to_string();
        assert!(err.contains("Write topic out") && err.contains("publish verdicts"), "{err}");
    }

    #[test]
    fn a_topic_it_may_not_describe_is_named_and_an_undecided_one_passes() {
        let answers =
            BTreeMap::from([("hidden".to_owned(), Answer::NotDescribable), ("unknown".to_owned(), Answer::Undecided)]);
        assert!(first_missing(&[need("unknown", &[Operation::Write])], &answers).is_ok());
        assert!(first_missing(&[need("absent", &[Operation::Write])], &answers).is_ok());
        let err = first_missing(&[need("hidden", &[Operation::Read])], &answers).unwrap_err().to_string();
        assert!(err.contains("Read topic hidden"), "{err}");
    }
}
