//! Reads of the checkpoint topic shared by the watches of a sink that load at the same time.
//!
//! Every watch loads its checkpoint by reading the whole compacted topic (one partition holding
//! every watch's records). Watches starting together (a `namespaceSelector` matching hundreds of
//! namespaces, a replica taking over watches) would each read it. Instead, the requests made
//! while a read runs wait for it to end and are then served together by the next read. That read
//! starts after each of them was made, so it is as fresh as a read of their own: a checkpoint
//! committed before a watch asked (by a replica it takes over from) is in it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// The latest value of each key of one watch's records.
pub type Latest = HashMap<String, Vec<u8>>;

/// Requests waiting for the next read, and the read running.
#[derive(Debug, Default)]
pub struct SharedReads {
    waiting: Mutex<Vec<Request>>,
    /// Held by the task running a read.
    reading: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Request {
    prefix: String,
    reply: oneshot::Sender<Result<Latest, String>>,
}

impl SharedReads {
    /// The records whose keys start with `prefix`, from a read that started after this call.
    /// `read` gets the prefixes of every request it serves and returns their records in the same
    /// order; the caller that runs it serves the others too. A failed read fails every request
    /// it served, with its error's text.
    pub async fn read<F, Fut, E>(&self, prefix: &str, read: F) -> Result<Latest, String>
    where
        F: Fn(Vec<String>) -> Fut,
        Fut: Future<Output = Result<Vec<Latest>, E>>,
        E: std::fmt::Display,
    {
        loop {
            let (reply, mut answer) = oneshot::channel();
            self.lock().push(Request {
                prefix: prefix.to_string(),
                reply,
            });
            // Either a read under way or the next one serves this request: once answered, the
            // caller stops waiting for its turn to read (a queue of callers each taking the turn
            // in order would serialize the watches behind every read).
            let answered = tokio::select! {
                biased;
                answered = &mut answer => answered,
                reading = self.reading.lock() => {
                    let batch = std::mem::take(&mut *self.lock());
                    if !batch.is_empty() {
                        serve(batch, &read).await;
                    }
                    drop(reading);
                    answer.await
                }
            };
            match answered {
                Ok(answered) => return answered,
                // The task serving this request was cancelled mid-read: ask again.
                Err(_) => continue,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Request>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn serve<F, Fut, E>(batch: Vec<Request>, read: &F)
where
    F: Fn(Vec<String>) -> Fut,
    Fut: Future<Output = Result<Vec<Latest>, E>>,
    E: std::fmt::Display,
{
    let prefixes: Vec<String> = batch.iter().map(|r| r.prefix.clone()).collect();
    tracing::debug!(
        watches = prefixes.len(),
        "reading the checkpoint topic for the watches loading"
    );
    match read(prefixes).await {
        Ok(found) => {
            for (request, records) in batch.into_iter().zip(found) {
                let _ = request.reply.send(Ok(records));
            }
        }
        Err(e) => {
            let error = e.to_string();
            for request in batch {
                let _ = request.reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A read that takes 10 ms and finds, for each prefix, one record named after the read.
    fn counting(
        reads: Arc<AtomicUsize>,
    ) -> impl Fn(Vec<String>) -> futures::future::BoxFuture<'static, Result<Vec<Latest>, String>>
    {
        move |prefixes| {
            let reads = reads.clone();
            Box::pin(async move {
                let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(prefixes
                    .iter()
                    .map(|p| Latest::from([(format!("{p}read"), vec![n as u8])]))
                    .collect())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_made_during_a_read_share_the_next_one_and_each_gets_its_own_records() {
        let shared = Arc::new(SharedReads::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..20 {
            let (shared, reads) = (shared.clone(), reads.clone());
            tasks.push(tokio::spawn(async move {
                shared.read(&format!("w{i}/"), counting(reads)).await
            }));
        }
        let mut served_by = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            let records = task.await.unwrap().expect("read");
            assert_eq!(records.len(), 1);
            let (key, read) = records.into_iter().next().unwrap();
            assert_eq!(key, format!("w{i}/read"), "a watch gets its own records");
            served_by.push(read[0]);
        }
        // The first request reads alone; the 19 made while it ran share the second read.
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        assert_eq!(served_by.iter().filter(|&&n| n == 2).count(), 19);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_made_after_a_read_started_is_served_by_a_later_read() {
        let shared = Arc::new(SharedReads::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let first = {
            let (shared, reads) = (shared.clone(), reads.clone());
            tokio::spawn(async move { shared.read("a/", counting(reads)).await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let late = shared.read("b/", counting(reads.clone())).await.unwrap();
        assert_eq!(first.await.unwrap().unwrap()["a/read"], [1]);
        assert_eq!(late["b/read"], [2], "not the read already under way");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_already_answered_returns_without_serving_later_ones() {
        let shared = Arc::new(SharedReads::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let start = tokio::time::Instant::now();
        let request = |prefix: &'static str, after_ms: u64| {
            let (shared, reads) = (shared.clone(), reads.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                shared.read(prefix, counting(reads)).await.unwrap();
                start.elapsed()
            })
        };
        // a reads from 0 to 10 ms; b and c wait, then share the read from 10 to 20 ms; d comes
        // during that one and is read from 20 to 30 ms.
        let tasks = [
            request("a/", 0),
            request("b/", 2),
            request("c/", 4),
            request("d/", 15),
        ];
        let mut done = Vec::new();
        for task in tasks {
            done.push(task.await.unwrap().as_millis());
        }
        assert_eq!(
            done,
            [10, 20, 20, 30],
            "c does not read for d before returning"
        );
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_fails_every_request_it_served_and_the_next_ones_read_again() {
        let shared = SharedReads::default();
        let failing = |_: Vec<String>| async { Err::<Vec<Latest>, _>("broker down") };
        let err = shared.read("a/", failing).await.unwrap_err();
        assert_eq!(err, "broker down");
        let reads = Arc::new(AtomicUsize::new(0));
        assert!(shared.read("a/", counting(reads)).await.is_ok());
    }
}
