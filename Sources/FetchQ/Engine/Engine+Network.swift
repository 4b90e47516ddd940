import CFetchQSupport
import CJansson
import Glibc
import Logging

// Network operations: the HTTP cache, the transfer, retries, shared transfers.

extension Engine {
    /// Whether network results get a history form (`OperationResult.historyForm`):
    /// not when the history keeps no network values, where it would never be used.
    var keepsHistoryForms: Bool { config.historyValues > 0 && config.history > 0 }

    /// With the lock held, as a network operation's start is resolved: its
    /// attempt's bookkeeping (the attempt number travels with the transfer to
    /// `transferEnded`). Done here rather than by `startTransfer`, which
    /// would take the lock once more per transfer: the two transfer threads
    /// met on it there (P7, bench/findings.md, Fifteenth round).
    func bookAttempt(_ op: Operation) -> Work {
        guard case .network(let job) = op.body else { return .start(op) }
        if op.startedAt == 0 { op.startedAt = monotonicNanos() }
        op.attempts += 1
        op.lastProgress = nil  // a new attempt's response counts from 0, its size its own
        return .startTransfer(op, job, attempt: op.attempts, transports: transports)
    }

    /// What the HTTP cache contributed to a transfer.
    struct CacheContext: Sendable {
        var key: String
        var requestCacheControl: String?
        /// The entry being revalidated (conditional headers were sent).
        var entry: HTTPCache.Entry?
        /// The request is made again without validators after a 304 that
        /// no entry could take: it stores its answer, and is not asked again.
        var askedAgain = false
        /// stale-while-revalidate delivered `entry` first (an update event):
        /// it stays the value if the refresh fails.
        var deliveredFirst = false
    }

    /// Starts an attempt of a network operation. `attempt` and `existing`
    /// (the transports made so far) were booked under the engine lock by
    /// `bookAttempt`, when its start was resolved.
    func startTransfer(_ op: Operation, _ job: NetworkJob, attempt: Int, existing: [CurlTransport]) {
        var job = job
        var cacheContext: CacheContext? = nil
        if attempt > 1 {
            // A retry, or the request made again after a 304 no entry could
            // take: no lookup; the first attempt's validators again (none
            // when asked again), its answer stored, the stale value kept.
            // (Each retry was made without any: the tenth review.)
            if let carried = lock.withLock({ op.nextAttemptCache.take() }) {
                cacheContext = carried
                if !carried.askedAgain, let entry = carried.entry {
                    job.request.headers += HTTPCache.conditionalHeaders(for: entry)
                }
            }
        } else if let cache = httpCache, let key = job.cacheKey {
            let control = job.requestCacheControl
            var context = CacheContext(key: key, requestCacheControl: control)
            var found: HTTPCache.Lookup = job.cache == .reload ? .miss : cache.lookup(key, now: wallClockSeconds(), requestCacheControl: control)
            let cap = job.request.maxResponseBytes
            if cap > 0, let entry = found.entry, entry.body.count > cap {
                // Stored for a request with a larger cap: this one must not
                // get it. The network decides (only-if-cached: it fails, as
                // the transfer would).
                guard job.cache != .onlyIfCached else {
                    finishRunning(op, OperationResult(id: op.id, outcome: .failed, status: .tooLarge,
                                                      message: "GET \(URLUtilities.redactingPassword(job.request.url)): the cached response body (\(entry.body.count) bytes) exceeds max_response_bytes (\(cap) bytes)",
                                                      value: nil))
                    return
                }
                found = .miss
            }
            switch (job.cache, found) {
            // A stale entry whose response said must-revalidate is never
            // served without asking the server (RFC 9111 §5.2.2.2).
            case (.onlyIfCached, .stale(let entry)) where entry.mustRevalidate || entry.noCache:
                let said = entry.noCache ? "no-cache" : "must-revalidate"
                finishRunning(op, OperationResult(id: op.id, outcome: .failed, status: .cacheMiss,
                                                  message: "GET \(URLUtilities.redactingPassword(job.request.url)): the cached response is stale and said \(said) (cache: only-if-cached)",
                                                  value: nil))
                return
            case (.staleWhileRevalidate, .stale(let entry)) where entry.mustRevalidate || entry.noCache:
                job.request.headers += HTTPCache.conditionalHeaders(for: entry)
                context.entry = entry
            case (.default, .fresh(let entry)), (.onlyIfCached, .fresh(let entry)), (.onlyIfCached, .stale(let entry)):
                let response = entry.response(url: job.request.url)
                workers.submit(qos: op.qos) { [self, job] in
                    transferEnded(op, job, .success(response), attempts: attempt, cache: nil, fromCache: true)
                }
                return
            case (.onlyIfCached, .miss):
                finishRunning(op, OperationResult(id: op.id, outcome: .failed, status: .cacheMiss,
                                                  message: "GET \(URLUtilities.redactingPassword(job.request.url)): not in the cache (cache: only-if-cached)", value: nil))
                return
            case (.staleWhileRevalidate, .fresh(let entry)), (.staleWhileRevalidate, .stale(let entry)):
                if let handler = lock.withLock({ eventHandler }) {
                    let cached = job.result(id: op.id, .success(entry.response(url: job.request.url)), queueWaitMs: 0,
                                            attempts: 0, cancelled: false, fromCache: true, historyForm: false)
                    delivery.post(.event(OperationEvent(id: op.id, kind: .update, child: cached), handler))
                }
                context.deliveredFirst = true
                fallthrough
            case (.default, .stale(let entry)):
                job.request.headers += HTTPCache.conditionalHeaders(for: entry)
                context.entry = entry
            default:
                break
            }
            cacheContext = context
        }
        let transport: CurlTransport
        if !existing.isEmpty {
            transport = pickTransport(existing)
        } else {
            lock.lock()
            if transports.isEmpty {
                do {
                    let owner = selfPointer
                    let ownerBits = UInt(bitPattern: owner)
                    for _ in 0..<config.transferThreads {
                        // Values parsed on the loop are freed by it (see
                        // ReleaseList). It keeps taking them back while it
                        // sleeps in curl_multi_poll, which it leaves at
                        // least once a second, and frees them when it wakes:
                        // closing the list for each sleep (several times per
                        // transfer) left about half of them to be freed on
                        // the other transfer thread, against this one's
                        // malloc arena (bench/findings.md, Sixteenth round).
                        let releases = ReleaseList()
                        transports.append(try CurlTransport(onLoopThread: {
                            fqs_set_current_engine(UnsafeRawPointer(bitPattern: ownerBits))
                            releases.makeCurrent()
                            releases.open()
                        }, onTurn: { turn in
                            switch turn {
                            case .woke:
                                releases.open()  // costs nothing when already open
                                releases.drain()
                            case .sleeping: releases.drain()
                            case .exiting: releases.close()
                            }
                        }))
                    }
                } catch {
                    let made = transports
                    transports = []
                    lock.unlock()
                    for t in made { t.shutdown() }
                    // Out of threads, memory or descriptors (pthread_create,
                    // curl_multi_init): the same status fq_engine_new gives.
                    finishRunning(op, OperationResult(id: op.id, outcome: .failed, status: .noMemory,
                                                      message: "cannot start the transport: \(error.message)", value: nil))
                    return
                }
            }
            let all = transports
            lock.unlock()
            transport = pickTransport(all)
        }
        var progress: (@Sendable (UInt64, UInt64) -> Void)? = nil
        if job.progressIntervalMs != nil {
            progress = { [unowned(unsafe) self] received, expected in
                let (handler, ids) = lock.withLock {
                    op.lastProgress = (received, expected)
                    return (eventHandler, progressTargets(op))
                }
                guard let handler else { return }
                for id in ids {
                    delivery.post(.event(OperationEvent(id: id, kind: .progress, received: received, expected: expected), handler))
                }
            }
        }
        // unowned(unsafe), as `Operation.engine`: the engine outlives its
        // transfers, and `unowned` counted on the engine object's one
        // refcount word from every thread, four times per transfer.
        let transfer = transport.start(job.request, progress: progress) { [unowned(unsafe) self, job, cacheContext] outcome in
            if transport.isLoopThread && endsOnLoop(job, outcome) {
                transferEnded(op, job, outcome, attempts: attempt, cache: cacheContext, onLoop: true)
                return
            }
            // Parsing a large body, or writing to SQLite, runs on a worker.
            workers.submit(qos: op.qos) { [self, job, cacheContext] in
                transferEnded(op, job, outcome, attempts: attempt, cache: cacheContext)
            }
        }
        // A cancel that arrived before the transfer id was known aborts it
        // now. Published under `transferLock` alone: a cancel marks the
        // operation before it looks for the id under that lock, so one of
        // the two sees the other (both may abort: the second is ignored).
        let cancelledMeanwhile = transferLock.withLock {
            // (To the carrier that took it over, if the leading caller of a
            // shared transfer was cancelled meanwhile: it goes on.)
            let runner = op.handedTo ?? op
            runner.transfer = transfer
            runner.transport = transport
            return runner.isCancelled
        }
        if cancelledMeanwhile { transport.cancel(transfer) }
    }

    /// The transport for a new transfer: the calling loop thread's own (a
    /// transfer started while its thread ended another), else the one with
    /// the fewest transfers, the first on ties (so that one request at a
    /// time keeps reusing one connection).
    private func pickTransport(_ all: [CurlTransport]) -> CurlTransport {
        if all.count == 1 { return all[0] }
        if let own = all.first(where: { $0.isLoopThread }) { return own }
        var best = all[0]
        var fewest = best.activeTransfers
        for t in all.dropFirst() where fewest > 0 {
            let n = t.activeTransfers
            if n < fewest { best = t; fewest = n }
        }
        return best
    }

    /// Whether the loop thread that finished a transfer ends the operation
    /// itself (parse, book, start what is next on the same thread: no
    /// hand-off to a worker and back). Not for large bodies (parsing would
    /// hold up the loop's other transfers) nor for SQLite writes (a search
    /// storing its items, a persistent HTTP cache).
    func endsOnLoop(_ job: NetworkJob, _ outcome: Result<HTTPResponse, TransportError>) -> Bool {
        if job.search?.store != nil || httpCache?.persistPath != nil { return false }
        if case .success(let response) = outcome, response.body.count > Self.loopBodyLimit { return false }
        return true
    }

    /// The largest body a loop thread parses itself (bytes).
    static let loopBodyLimit = 64 * 1024

    /// Cache-Control or Expires, in any ASCII case (compared in place: this
    /// runs on every header of every response that might be cached).
    static func isCachingHeader(_ name: String) -> Bool {
        TransportText.equalsIgnoringASCIICase(name, "cache-control") || TransportText.equalsIgnoringASCIICase(name, "expires")
    }

    /// GET, HEAD, OPTIONS and TRACE (RFC 9110 §9.2.1): the others may change
    /// what the server has.
    static func isSafe(_ method: String) -> Bool {
        method == "GET" || method == "HEAD" || method == "OPTIONS" || method == "TRACE"
    }

    /// A transfer ended: retry it, or turn it into the result(s).
    func transferEnded(_ op: Operation, _ job: NetworkJob, _ outcome: Result<HTTPResponse, TransportError>,
                       attempts: Int, cache context: CacheContext?, fromCache: Bool = false, onLoop: Bool = false) {
        // A leading caller cancelled while its transfer ran for others: the
        // carrier that took the transfer over retries it or ends it.
        let op = op.isCancelled ? (lock.withLock { op.handedTo } ?? op) : op
        var outcome = outcome
        // (A fresh entry answered without a transfer; a 304 below makes the
        // answer come from the cache too, after one.)
        let withoutTransfer = fromCache
        var fromCache = fromCache
        // A 304 that no entry can take (another entity tag, or none left):
        // the request goes again without validators (RFC 9111 §4.3.4), at once.
        var askAgain = false
        // What the next attempt keeps, if there is one.
        var nextAttempt = context
        if let cache = httpCache, case .success(let response) = outcome, response.status < 400,
           !Self.isSafe(job.request.method) {
            // An unsafe request that succeeded: the stored answers for its URL
            // may be out of date (RFC 9111 §4.4).
            cache.invalidate(url: job.request.url)
        }
        if let context, let cache = httpCache, case .success(let response) = outcome {
            let now = wallClockSeconds()
            if response.metrics.redirects > 0 {
                // The answer of another URL: never stored under this one's
                // key (that would keep the redirect, which may change, for
                // as long as the target may be cached). A 304 there answered
                // the validators libcurl carried to it, which no entry can
                // take: asked again without them (the tenth review: it ended
                // FQ_ERR_HTTP 304 with no body).
                if response.status == 304, context.entry != nil, !context.askedAgain {
                    askAgain = true
                    nextAttempt?.askedAgain = true
                }
                // The URL redirects now: an entry of its own is out of date
                // (with a 304 there, every GET was two requests, validators
                // carried to the target first; with a 200, the old entry
                // went on answering "only-if-cached" and being delivered
                // first: the tenth review).
                cache.removeIfHeld(context.key)
            } else if response.status == 304, let validated = context.entry, !context.askedAgain {
                if let refreshed = cache.refresh(context.key, notModifiedHeaders: response.headers, now: now,
                                                 validated: validated) {
                    // Revalidated: the cached body, with this transfer's metrics.
                    var revalidated = refreshed.response(url: job.request.url)
                    revalidated.metrics = response.metrics
                    outcome = .success(revalidated)
                    fromCache = true
                } else {
                    askAgain = true
                    nextAttempt?.askedAgain = true
                }
            } else if response.headers.contains(where: { Self.isCachingHeader($0.name) }) {
                // Only responses that say how to cache them (Cache-Control or
                // Expires) are offered to the cache: storing every response
                // with just a validator cost every request a copy of its body.
                cache.store(context.key, status: response.status, headers: response.headers, body: response.body,
                            requestCacheControl: context.requestCacheControl, now: now)
            } else if HTTPCache.cacheableStatuses.contains(response.status) {
                // A newer answer, not stored: the entry it replaces is out
                // of date (it went on answering after a "reload" or a
                // "no-cache" request: the tenth review).
                cache.removeIfHeld(context.key)
            }
        }
        if let cache = httpCache, cache.persistPath != nil, cache.takeReopened() {
            logger.notice("http cache: its file was deleted; entries are written to a new file at its path",
                          metadata: ["path": "\(cache.persistPath ?? "")"])
        }
        if let cache = httpCache, cache.persistPath != nil, let error = cache.takeUnreportedPersistenceError() {
            // The entry stays in memory; the file missed it (locked by another
            // writer, read-only, full): said once per run of failed writes.
            logger.warning("http cache: not written to its file", metadata: ["path": "\(cache.persistPath ?? "")",
                                                                           "error": "\(error.message)"])
        }
        // The request made again after a 304 is the cache's, not a retry:
        // it does not count against "max" (it did: the tenth review).
        let retries = attempts - (context?.askedAgain == true ? 1 : 0)
        if let delay = askAgain ? 0 : job.retry.delay(after: outcome, attempt: retries, method: job.request.method,
                                                      now: wallClockSeconds()) {
            lock.lock()
            // A leading caller cancelled since the top of this function (the
            // cache's work above takes time): the carrier that took its
            // transfer over retries it for the callers. (It ended their
            // transfer with the failed attempt: the ninth review.)
            let op = op.isCancelled ? (op.handedTo ?? op) : op
            if machine.state(of: op.id) == .running && !op.isCancelled {
                op.nextAttemptCache = nextAttempt
                transferLock.withLock { op.transfer = nil }
                let now = monotonicNanos()
                let until = now + UInt64(min(delay, 86_400) * 1e9)
                if let shared = op.leads ?? op.carries {
                    shared.retryAt = until
                    shared.attempts = attempts
                    shared.nextAttemptCache = nextAttempt
                }
                let work = resolve(machine.retryLater(op.id, until: until, now: now))
                lock.unlock()
                // Never log with the lock held: a log callback may call into the library.
                logger.info("retrying", metadata: ["id": "\(op.id)", "attempt": "\(attempts + 1)", "delay_s": "\(delay)"])
                execute(work)
                timer.kick()
                return
            }
            lock.unlock()
        }
        // Throttling may have skipped the last progress: report the total
        // (with the size the server announced, 0 if it did not). An empty
        // body had none: it gets this one, and so does a body a 304 took
        // from the cache (it had none: the ninth review's review).
        if job.progressIntervalMs != nil, !withoutTransfer, case .success(let response) = outcome {
            let total = UInt64(response.body.count)
            let (handler, last, ids) = lock.withLock {
                (eventHandler, op.lastProgress, progressTargets(op))
            }
            if let handler, last.map({ $0.0 != total }) ?? true {
                for id in ids {
                    delivery.post(.event(OperationEvent(id: id, kind: .progress, received: total,
                                                        expected: last?.1 ?? total), handler))
                }
            }
        }
        // A shared transfer: every caller still attached gets its own result
        // from the outcome, on the workers so that they end in parallel. (A
        // local function: nothing is allocated for it unless a caller is left.)
        let endOutcome = outcome, endFromCache = fromCache
        @Sendable func endCaller(_ caller: Operation, _ onLoop: Bool) {
            guard case .network(let callerJob) = caller.body else { return }
            let queueWaitMs = Double(op.startedAt > caller.submittedAt ? op.startedAt - caller.submittedAt : 0) / 1e6
            let result = callerJob.result(id: caller.id, endOutcome, queueWaitMs: queueWaitMs, attempts: attempts,
                                          cancelled: caller.isCancelled, fromCache: endFromCache,
                                          historyForm: keepsHistoryForms)
            continueWith(finishRunning(caller, result, onWorker: true), onLoop: onLoop)
        }
        guard op.carries != nil else {
            // The operation's own transfer (it may lead callers sharing it).
            let queueWaitMs = Double(op.startedAt - op.submittedAt) / 1e6
            var result = job.result(id: op.id, outcome, queueWaitMs: queueWaitMs, attempts: attempts,
                                    cancelled: op.isCancelled, fromCache: fromCache, historyForm: keepsHistoryForms)
            if result.outcome == .failed, job.cache == .staleWhileRevalidate, context?.deliveredFirst == true,
               let stale = context?.entry {
                // The refresh failed: the stale value stays readable.
                let cached = job.result(id: op.id, .success(stale.response(url: job.request.url)), queueWaitMs: queueWaitMs,
                                        attempts: attempts, cancelled: false, fromCache: true, historyForm: false)
                result = OperationResult(id: op.id, outcome: .failed, status: result.status,
                                         message: (result.message ?? "") + " (the stale cached value is kept as the value)",
                                         value: cached.value, http: result.http)
            }
            let next = finishRunning(op, result, onWorker: true) { callers, _ in
                for caller in callers { workers.submit(qos: caller.qos) { endCaller(caller, false) } }
            }
            continueWith(next, onLoop: onLoop)
            return
        }
        // A carrier. On a loop thread the first caller ends here, after the
        // carrier; the others, and all of them on a worker, go to the workers.
        var here: Operation? = nil
        let ok = (try? outcome.get()) != nil
        finishRunning(op, OperationResult(id: op.id, outcome: op.isCancelled ? .cancelled : ok ? .succeeded : .failed,
                                          status: op.isCancelled ? .cancelled : ok ? .ok : .network, message: nil,
                                          value: nil)) { callers, _ in
            here = onLoop ? callers.first : nil
            for caller in callers where caller !== here {
                workers.submit(qos: caller.qos) { endCaller(caller, false) }
            }
        }
        if let here { endCaller(here, true) }
    }

    /// Runs the block operation a finish handed to this thread: here on a
    /// worker, on a worker when the thread is a transfer loop.
    private func continueWith(_ next: Operation?, onLoop: Bool) {
        guard let next else { return }
        if onLoop {
            workers.submit(qos: next.qos, job: .run(next))
        } else {
            runBody(next)
        }
    }
}
