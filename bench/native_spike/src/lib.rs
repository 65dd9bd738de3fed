//! Consume a topic into Arrow-layout column buffers, with no Python object per record.
//!
//! `ColumnConsumer.poll_columns(max_records, timeout_ms)` returns the values as one data buffer plus
//! int32 offsets, and partitions, offsets and timestamps as packed little-endian arrays: the buffers
//! `pyarrow.Array.from_buffers` takes, so the Python side builds each column with one call.
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

#[pyclass]
struct ColumnConsumer {
    consumer: BaseConsumer,
}

type Columns<'py> = (Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>,
                     Bound<'py, PyBytes>, usize);

#[pymethods]
impl ColumnConsumer {
    /// Assign every partition in `0..partitions` of `topic` from the beginning, read_committed.
    #[new]
    fn new(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> PyResult<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "false")
            // the sources' settings (connectors.source: FETCH_DEFAULTS, PREFETCH_BOUND)
            .set("fetch.queue.backoff.ms", "10")
            .set("queued.max.messages.kbytes", "32768")
            .create()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions {
            assignment.add_partition_offset(topic, partition, Offset::Beginning)
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        }
        consumer.assign(&assignment).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(Self { consumer })
    }

    /// Up to `max_records` records: waits `timeout_ms` for the first, then takes what is already fetched.
    fn poll_columns<'py>(&self, py: Python<'py>, max_records: usize, timeout_ms: u64) -> PyResult<Columns<'py>> {
        let mut data: Vec<u8> = Vec::with_capacity(max_records * 200);
        let mut value_offsets: Vec<u8> = Vec::with_capacity((max_records + 1) * 4);
        let mut partitions: Vec<u8> = Vec::with_capacity(max_records * 4);
        let mut offsets: Vec<u8> = Vec::with_capacity(max_records * 8);
        let mut timestamps: Vec<u8> = Vec::with_capacity(max_records * 8);
        value_offsets.extend_from_slice(&0i32.to_le_bytes());
        let mut count = 0usize;
        let consumer = &self.consumer;
        py.allow_threads(|| -> PyResult<()> {
            let mut wait = Duration::from_millis(timeout_ms);
            while count < max_records {
                match consumer.poll(wait) {
                    None => break,
                    Some(Err(e)) => return Err(PyRuntimeError::new_err(e.to_string())),
                    Some(Ok(message)) => {
                        data.extend_from_slice(message.payload().unwrap_or(&[]));
                        value_offsets.extend_from_slice(&(data.len() as i32).to_le_bytes());
                        partitions.extend_from_slice(&message.partition().to_le_bytes());
                        offsets.extend_from_slice(&message.offset().to_le_bytes());
                        timestamps.extend_from_slice(&message.timestamp().to_millis().unwrap_or(-1).to_le_bytes());
                        count += 1;
                        wait = Duration::ZERO;
                    }
                }
            }
            Ok(())
        })?;
        Ok((PyBytes::new(py, &data), PyBytes::new(py, &value_offsets), PyBytes::new(py, &partitions),
            PyBytes::new(py, &offsets), PyBytes::new(py, &timestamps), count))
    }
}

#[pyclass]
struct ColumnProducer {
    producer: BaseProducer,
}

#[pymethods]
impl ColumnProducer {
    #[new]
    fn new(bootstrap: &str, linger_ms: u32) -> PyResult<Self> {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("linger.ms", linger_ms.to_string())
            .set("enable.idempotence", "true")
            // the sinks' settings (sinks.writer.KafkaWriter)
            .set("batch.num.messages", "10000")
            .set("compression.type", "lz4")
            .create()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(Self { producer })
    }

    /// Produce every value of an Arrow binary column (its data buffer and int32 offsets) to `partition`.
    fn produce_column(&self, py: Python<'_>, topic: &str, partition: i32, data: &[u8], offsets: &[u8]) -> PyResult<usize> {
        let producer = &self.producer;
        py.allow_threads(|| -> PyResult<usize> {
            let bounds: Vec<i32> = offsets.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            for window in bounds.windows(2) {
                let value = &data[window[0] as usize..window[1] as usize];
                loop {
                    match producer.send(BaseRecord::<(), [u8]>::to(topic).partition(partition).payload(value)) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                            producer.poll(Duration::from_millis(10));
                        }
                        Err((e, _)) => return Err(PyRuntimeError::new_err(e.to_string())),
                    }
                }
            }
            producer.poll(Duration::ZERO);
            Ok(bounds.len().saturating_sub(1))
        })
    }

    fn flush(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        let producer = &self.producer;
        py.allow_threads(|| producer.flush(Duration::from_secs_f64(timeout_s)))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }
}

#[pymodule]
fn epochline_native_spike(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<ColumnConsumer>()?;
    module.add_class::<ColumnProducer>()?;
    Ok(())
}
