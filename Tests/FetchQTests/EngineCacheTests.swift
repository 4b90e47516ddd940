import CJansson
@testable import FetchQ
import Glibc
import Synchronization
import Testing

/// The engine's HTTP cache against the test server's cache routes, whose
/// bodies carry a per-key request count (a cached body shows an old count).
@Suite(.serialized) struct EngineCacheTests {
    let server: TestServer
    init() throws { server = try TestServer() }

    func serverCount(_ path: String) throws -> Int64 {
        let (_, body) = try server.get("/stats")
        return try JSONParser.parse(body, maxDepth: 64).at("/by_path/\(path.replacingSlash())")?.integerValue ?? 0
    }

    @Test func freshEntriesAnswerWithoutARequest() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = server.url("/cache?max_age=60&key=fresh")
            let first = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            let second = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(first.fromCache == false)
            #expect(second.fromCache == true)
            #expect(second.outcome == .succeeded)
            #expect(second.http?.status == 200)
            #expect(second.value?.at("/count")?.integerValue == 1)
            #expect(second.http?.metrics?.at("/from_cache")?.boolValue == true)
            #expect(engine.stats().at("/cache/hits")?.integerValue == 1)
        }
        #expect(try serverCount("/cache") == 1)
    }

    @Test func staleEntriesAreRevalidatedAndA304KeepsTheBody() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = server.url("/etag?key=reval")  // max-age=0 with an ETag
            let first = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            let second = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(first.value?.at("/count")?.integerValue == 1)
            #expect(second.outcome == .succeeded)
            #expect(second.http?.status == 200)
            #expect(second.fromCache == true)
            // The server answered 304 to the second: the body is the first one's.
            #expect(second.value?.at("/count")?.integerValue == 1)
        }
        #expect(try serverCount("/etag") == 2)
    }

    @Test func noStoreReloadAndOnlyIfCached() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let noStore = server.url("/cache?max_age=60&no_store=1&key=ns")
            _ = c.wait(try engine.request(#"{"url": "\#(noStore)"}"#, on: queue, c))
            let again = try #require(c.wait(try engine.request(#"{"url": "\#(noStore)"}"#, on: queue, c)))
            #expect(again.fromCache == false)
            #expect(again.value?.at("/count")?.integerValue == 2)

            let cached = server.url("/cache?max_age=60&key=rl")
            let miss = try #require(c.wait(try engine.request(#"{"url": "\#(cached)"}"#, options: #"{"cache": "only-if-cached"}"#, on: queue, c)))
            #expect(miss.outcome == .failed)
            #expect(miss.status == .cacheMiss)
            _ = c.wait(try engine.request(#"{"url": "\#(cached)"}"#, on: queue, c))
            let reload = try #require(c.wait(try engine.request(#"{"url": "\#(cached)"}"#, options: #"{"cache": "reload"}"#, on: queue, c)))
            #expect(reload.fromCache == false)
            #expect(reload.value?.at("/count")?.integerValue == 2)
            let hit = try #require(c.wait(try engine.request(#"{"url": "\#(cached)"}"#, options: #"{"cache": "only-if-cached"}"#, on: queue, c)))
            #expect(hit.fromCache == true)
            #expect(hit.value?.at("/count")?.integerValue == 2)  // the reload refreshed the entry
        }
        #expect(try serverCount("/cache") == 4)
    }

    /// An entry stored by one request answers another only if that one would
    /// have been allowed the same response: without TLS verification, with
    /// another CA file, or with redirects not followed, a response is kept
    /// apart; a smaller size cap is not answered by a larger entry.
    @Test func anEntryAnswersOnlyARequestAllowedTheSameResponse() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            func get(_ key: String, _ options: String? = nil) throws -> OperationResult {
                let url = server.url("/cache?max_age=60&key=\(key)")
                return try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, options: options, on: queue, c)))
            }
            for (key, options) in [("tls", #"{"verify_tls": false}"#),
                                   ("ca", #"{"ca_file": "/etc/ssl/certs/ca-certificates.crt"}"#),
                                   ("follow", #"{"max_redirects": 0}"#),
                                   ("agent", #"{"user_agent": "agent-B"}"#)] {
                let unusual = try get(key, options)
                #expect(unusual.outcome == .succeeded)
                let plain = try get(key)
                #expect(plain.fromCache == false, "\(key)")
                #expect(plain.value?.at("/count")?.integerValue == 2, "\(key)")
                let again = try get(key, options)  // its own entry is still there
                #expect(again.fromCache == true, "\(key)")
                #expect(again.value?.at("/count")?.integerValue == 1, "\(key)")
            }
            // The body {"key": "cap", "max_age": 60, "count": 1} is 41 bytes.
            let stored = try get("cap")
            #expect(stored.outcome == .succeeded)
            let capped = try get("cap", #"{"max_response_bytes": 10}"#)
            #expect(capped.outcome == .failed)
            #expect(capped.status == .tooLarge)
            #expect(capped.fromCache == false)
            let cachedOnly = try get("cap", #"{"max_response_bytes": 10, "cache": "only-if-cached"}"#)
            #expect(cachedOnly.outcome == .failed)
            #expect(cachedOnly.status == .tooLarge)
            #expect(cachedOnly.message?.contains("exceeds max_response_bytes (10 bytes)") == true, "\(String(describing: cachedOnly.message))")
            let roomy = try get("cap", #"{"max_response_bytes": 1000}"#)
            #expect(roomy.fromCache == true)
        }
        // tls, ca, follow and agent: 2 requests each; cap: the first and the capped one.
        #expect(try serverCount("/cache") == 10)
    }

    @Test func aRedirectedResponseIsNotStored() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let target = URLUtilities.percentEncode("/cache?max_age=60&key=redirected")
            let url = server.url("/redirect-to?url=\(target)&status=302")
            for count in 1...2 {
                let r = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
                #expect(r.outcome == .succeeded)
                #expect(r.fromCache == false)
                #expect(r.value?.at("/count")?.integerValue == Int64(count))
            }
        }
        #expect(try serverCount("/cache") == 2)
        #expect(try serverCount("/redirect-to") == 2)
    }

    @Test func aNoCacheRequestRefreshesTheEntryPlainRequestsUse() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = server.url("/cache?max_age=60&key=refresh")
            let first = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(first.value?.at("/count")?.integerValue == 1)
            // "no-cache" asks the server, here with the entry's validator
            // (the route answers 304 to If-Modified-Since): the answer is the
            // entry plain requests get next, not one of its own.
            let forced = try #require(c.wait(try engine.request(
                #"{"url": "\#(url)", "headers": {"Cache-Control": "no-cache"}}"#, on: queue, c)))
            #expect(forced.outcome == .succeeded)
            #expect(try serverCount("/cache") == 2)
            let (_, stats) = try server.get("/stats")
            let log = try JSONParser.parse(stats, maxDepth: 64)
            let forcedHeaders = (0..<50).lazy.compactMap { log.at("/headers_log/\($0)/headers") }
                .first { $0.at("/cache-control")?.stringValue == "no-cache" }
            #expect(forcedHeaders?.at("/if-modified-since")?.stringValue == "Wed, 01 Jan 2025 00:00:00 GMT")
            let plain = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(plain.fromCache == true)
            #expect(plain.value?.at("/count")?.integerValue == forced.value?.at("/count")?.integerValue)
        }
        #expect(try serverCount("/cache") == 2)
    }

    @Test func staleWhileRevalidateDeliversTheCachedValueFirst() throws {
        try withEngine { engine, queue, c in
            let url = server.url("/cache?max_age=0&key=swr")
            _ = c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))
            let id = try engine.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "stale-while-revalidate"}"#, on: queue, c)
            let r = try #require(c.wait(id))
            let updates = c.allEvents.filter { $0.id == id && $0.kind == .update }
            #expect(updates.count == 1)
            #expect(updates.first?.child?.fromCache == true)
            #expect(updates.first?.child?.value?.at("/count")?.integerValue == 1)
            #expect(r.outcome == .succeeded)
            let log = c.deliveryLog
            #expect(log.firstIndex(of: "event \(id)")! < log.firstIndex(of: "done \(id)")!)
        }
    }

    /// A stale entry whose response said must-revalidate is not served
    /// without the server (RFC 9111 §5.2.2.2): only-if-cached misses, and
    /// stale-while-revalidate does not deliver it first. Without the
    /// directive both serve the stale entry.
    @Test func mustRevalidateEntriesAreNotServedStale() throws {
        try withEngine { engine, queue, c in
            func get(_ query: String, _ options: String? = nil) throws -> OperationResult {
                let url = server.url("/cache?\(query)")
                return try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, options: options, on: queue, c)))
            }
            for (query, must) in [("max_age=0&must_revalidate=1&key=mr", true), ("max_age=0&key=plain", false)] {
                #expect(try get(query).outcome == .succeeded)  // stored, stale at once
                let cachedOnly = try get(query, #"{"cache": "only-if-cached"}"#)
                if must {
                    #expect(cachedOnly.status == .cacheMiss)
                    #expect(cachedOnly.message?.contains("must-revalidate") == true, "\(cachedOnly.message ?? "")")
                } else {
                    #expect(cachedOnly.outcome == .succeeded && cachedOnly.fromCache)
                }
                let swr = try get(query, #"{"cache": "stale-while-revalidate"}"#)
                #expect(swr.outcome == .succeeded)
                let updates = c.allEvents.filter { $0.id == swr.id && $0.kind == .update }
                #expect(updates.count == (must ? 0 : 1), "\(query)")
            }
        }
    }

    /// A successful unsafe request invalidates what is stored for its URL,
    /// whatever the request headers of each entry (RFC 9111 §4.4); a safe one
    /// does not.
    @Test func anUnsafeRequestInvalidatesItsURL() throws {
        try withEngine { engine, queue, c in
            let url = server.url("/cache?max_age=60&key=inv")
            func get(_ headers: String = "{}") throws -> OperationResult {
                try #require(c.wait(try engine.request(#"{"url": "\#(url)", "headers": \#(headers)}"#, on: queue, c)))
            }
            for method in ["POST", "DELETE", "PUT"] {
                _ = try get()
                _ = try get(#"{"Accept": "application/json"}"#)
                #expect(try get().fromCache && get(#"{"Accept": "application/json"}"#).fromCache, "\(method)")
                let head = try #require(c.wait(try engine.request(#"{"url": "\#(url)", "method": "HEAD"}"#, on: queue, c)))
                #expect(head.outcome == .succeeded)
                #expect(try get().fromCache, "HEAD is safe")
                let unsafe = try #require(c.wait(try engine.request(#"{"url": "\#(url)", "method": "\#(method)", "body": "x"}"#,
                                                                   on: queue, c)))
                #expect(unsafe.outcome == .succeeded)
                #expect(try get().fromCache == false, "\(method)")
                #expect(try get(#"{"Accept": "application/json"}"#).fromCache == false, "\(method)")
            }
        }
    }

    /// URLs are compared as the server sees them: scheme and host in any
    /// case, with or without a fragment, name one entry, and an unsafe
    /// request to any of those forms removes it. (A POST to "HTTP://..." or
    /// to ".../inv" left the entries of "http://..." and ".../inv#top":
    /// the tenth review.)
    @Test func theCacheComparesURLsAsTheServerDoes() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = server.url("/cache?max_age=60&key=forms")
            let upper = "HTTP://" + url.dropFirst("http://".count)
            func get(_ u: String) throws -> OperationResult {
                try #require(c.wait(try engine.request(#"{"url": "\#(u)"}"#, on: queue, c)))
            }
            #expect(try get(url).fromCache == false)
            #expect(try get(upper).fromCache == true)
            #expect(try get(url + "#top").fromCache == true)

            for unsafe in [upper, url + "#top"] {
                let post = try #require(c.wait(try engine.request(#"{"url": "\#(unsafe)", "method": "POST", "body": "x"}"#,
                                                                  on: queue, c)))
                #expect(post.outcome == .succeeded)
                #expect(try get(url).fromCache == false, "\(unsafe)")
                #expect(try get(url + "#top").fromCache == true)
            }
        }
        #expect(try serverCount("/cache") == 5)
    }

    /// A fresh entry answers without the network, so it takes no slot of its
    /// host and no rate token: it answers while the host's one slot is held
    /// by a stalled request, and after the only token of the next 1000 s
    /// was used. (It used to wait for both.)
    @Test func freshHitsTakeNoHostSlotOrRateToken() throws {
        let host = "127.0.0.1:\(server.port)"
        try withEngine(#"{"max_per_host": 1, "rate_limits": {"\#(host)": {"per_second": 0.001, "burst": 1}}}"#,
                       queue: 4) { engine, queue, c in
            let url = server.url("/cache?max_age=600&key=slots")
            let first = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(first.outcome == .succeeded && !first.fromCache)
            let stalled = try engine.request(#"{"url": "\#(server.url("/stall"))"}"#, on: queue, c)
            for mode in ["default", "only-if-cached", "default"] {
                let hit = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#,
                                                                 options: #"{"cache": "\#(mode)"}"#, on: queue, c)),
                                       "\(mode): still waiting")
                #expect(hit.outcome == .succeeded && hit.fromCache, "\(mode)")
            }
            // A request that needs the network still waits (the slot and the token are taken).
            let miss = try engine.request(#"{"url": "\#(server.url("/json?size=10"))"}"#, on: queue, c)
            #expect(c.wait(miss, timeoutMs: 300) == nil)
            try engine.cancel(stalled)
            try engine.cancel(miss)
            #expect(engine.waitIdle(timeoutMs: 10_000) == .ok)
        }
    }

    /// The same for a fresh entry only in the cache's file (stored by an
    /// earlier engine): it waited for the host's slot and a rate token before
    /// answering (the scenario review: 1.9 s for 20 entries at 10/s).
    @Test func freshHitsFromTheCacheFileTakeNoHostSlotOrRateToken() throws {
        var template = Array("/tmp/fetchq-cache-XXXXXX".utf8CString)
        let dir = String(cString: try #require(template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }))
        defer {
            for s in ["", "-wal", "-shm"] { unlink(dir + "/c.db" + s) }
            rmdir(dir)
        }
        let urls = (0..<3).map { server.url("/cache?max_age=600&key=file-\($0)") }
        try withEngine(#"{"cache": {"path": "\#(dir)/c.db"}}"#) { engine, queue, c in
            for url in urls {
                let stored = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
                #expect(stored.outcome == .succeeded && !stored.fromCache)
            }
        }
        let host = "127.0.0.1:\(server.port)"
        try withEngine(#"{"cache": {"path": "\#(dir)/c.db"}, "max_per_host": 1, "#
                       + #""rate_limits": {"\#(host)": {"per_second": 0.001, "burst": 1}}}"#, queue: 4) { engine, queue, c in
            let stalled = try engine.request(#"{"url": "\#(server.url("/stall"))"}"#, on: queue, c)
            for url in urls {
                let hit = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)), "still waiting")
                #expect(hit.outcome == .succeeded && hit.fromCache)
            }
            try engine.cancel(stalled)
            #expect(engine.waitIdle(timeoutMs: 10_000) == .ok)
        }
    }

    @Test func staleWhileRevalidateKeepsTheStaleValueWhenTheRefreshFails() throws {
        var url = ""
        try withEngine { engine, queue, c in
            do {
                let doomed = try TestServer()
                url = doomed.url("/cache?max_age=0&key=gone")
                #expect(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))?.outcome == .succeeded)
            }  // the server is stopped here
            let id = try engine.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "stale-while-revalidate"}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .failed)
            #expect(r.status == .network)
            #expect(r.value?.at("/key")?.stringValue == "gone")
            #expect(c.allEvents.contains { $0.id == id && $0.kind == .update })
        }
    }

    /// The test server's `/steps` route for `key`, answering request n
    /// with step n of `steps` (see testserver.py).
    func stepsURL(_ key: String, _ steps: String) -> String {
        server.url("/steps?key=\(key)&s=\(URLUtilities.percentEncode(steps))")
    }

    /// The If-None-Match of each request the server logged for `/steps`, in
    /// order ("" for none).
    func validatorsSentToSteps() throws -> [String] {
        let log = try JSONParser.parse(try server.get("/stats").1, maxDepth: 64)
        return (0..<50).compactMap { i -> String? in
            guard log.at("/headers_log/\(i)/path")?.stringValue == "/steps" else { return nil }
            return log.at("/headers_log/\(i)/headers/if-none-match")?.stringValue ?? ""
        }
    }

    /// A retry keeps what the cache gave the first attempt: its validators
    /// are sent again, stale-while-revalidate's stale value stays the value
    /// of the failure, and a retry's answer is stored. (Each retry was made
    /// without the cache: the tenth review.)
    @Test func aRetryKeepsTheCacheOfItsFirstAttempt() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let stale = stepsURL("swr-retry", #"200;Cache-Control=max-age=0;ETag="v1";body={"v": 1}|503;body={"busy": true}"#)
            #expect(c.wait(try engine.request(#"{"url": "\#(stale)"}"#, on: queue, c))?.outcome == .succeeded)
            let id = try engine.request(#"{"url": "\#(stale)"}"#,
                                        options: #"{"cache": "stale-while-revalidate", "retry": {"max": 2, "base": 0.01}}"#,
                                        on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .failed)
            #expect(r.status == .http)
            #expect(r.http?.status == 503)
            #expect(r.http?.metrics?.at("/attempts")?.integerValue == 3)
            #expect(r.value?.at("/v")?.integerValue == 1)
            #expect(r.message?.contains("the stale cached value is kept") == true)
            #expect(c.allEvents.filter { $0.id == id && $0.kind == .update }.count == 1)
            #expect(try validatorsSentToSteps() == ["", #""v1""#, #""v1""#, #""v1""#])

            let late = stepsURL("store-retry", #"503;body={}|200;Cache-Control=max-age=300;body={"v": 2}"#)
            let first = try #require(c.wait(try engine.request(#"{"url": "\#(late)"}"#,
                                                               options: #"{"retry": {"max": 1, "base": 0.01}}"#, on: queue, c)))
            #expect(first.outcome == .succeeded)
            #expect(first.http?.metrics?.at("/attempts")?.integerValue == 2)
            let second = try #require(c.wait(try engine.request(#"{"url": "\#(late)"}"#, on: queue, c)))
            #expect(second.fromCache == true)
            #expect(second.value?.at("/v")?.integerValue == 2)
        }
        #expect(try serverCount("/steps") == 6)
    }

    /// A shared GET whose first caller is cancelled while the transfer waits
    /// to be retried: the carrier that retries it for the other caller keeps
    /// the cache's validators and stores the answer. (It sent none, and the
    /// answer was not stored: the tenth review's check of its changes.)
    @Test func aCarrierRetryingASharedGetKeepsItsCache() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = stepsURL("carrier", #"200;Cache-Control=max-age=0;ETag="v1";body={"v": 1}|503;Retry-After=1;body={}|200;Cache-Control=max-age=100;ETag="v2";body={"v": 2}"#)
            #expect(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))?.outcome == .succeeded)
            let options = #"{"retry": {"max": 2, "base": 0.05, "max_delay": 5}}"#
            let lead = try engine.request(#"{"url": "\#(url)"}"#, options: options, on: queue, c)
            let other = try engine.request(#"{"url": "\#(url)"}"#, options: options, on: queue, c)
            // Until the 503 came back and the transfer waits for its retry
            // (Retry-After: 1 s), at most 5 s.
            var waited = 0
            while waited < 500, (try? serverCount("/steps")) != 2 || (try? engine.state(of: lead)) != .ready {
                usleep(10_000)
                waited += 1
            }
            #expect(try serverCount("/steps") == 2)
            try engine.cancel(lead)
            let r = try #require(c.wait(other))
            #expect(r.outcome == .succeeded)
            #expect(r.value?.at("/v")?.integerValue == 2)
            let cached = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#,
                                                                options: #"{"cache": "only-if-cached"}"#, on: queue, c)))
            #expect(cached.fromCache == true)
            #expect(cached.value?.at("/v")?.integerValue == 2)
            #expect(try validatorsSentToSteps() == ["", #""v1""#, #""v1""#])
        }
    }

    /// The request made again without validators after a 304 that no entry
    /// could take is the cache's, not a retry: a 503 after it is still
    /// retried with "max": 1. (It used the retry up: the tenth review.)
    @Test func theRequestMadeAgainAfterA304IsNotARetry() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = stepsURL("again", #"200;Cache-Control=max-age=0;ETag="v1";body={"v": 1}|304;ETag="v2"|503;body={}|200;Cache-Control=max-age=0;body={"v": 4}"#)
            #expect(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))?.outcome == .succeeded)
            let r = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#,
                                                           options: #"{"retry": {"max": 1, "base": 0.01}}"#, on: queue, c)))
            #expect(r.outcome == .succeeded)
            #expect(r.value?.at("/v")?.integerValue == 4)
            #expect(r.http?.metrics?.at("/attempts")?.integerValue == 3)
            #expect(try validatorsSentToSteps() == ["", #""v1""#, "", ""])
        }
        #expect(try serverCount("/steps") == 4)
    }

    /// A revalidation that a redirect takes to a URL answering 304 to the
    /// validators libcurl carried there is asked again without them: the
    /// caller gets the redirect's target, not "HTTP status 304". (The
    /// tenth review.)
    @Test func aRevalidationRedirectedToA304IsAskedAgain() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = stepsURL("moved", #"200;Cache-Control=max-age=0;ETag="same";body={"v": 1}|301;Location=/etag?key=t&version=same"#)
            #expect(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))?.outcome == .succeeded)
            let r = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(r.outcome == .succeeded, "\(r.message ?? "")")
            #expect(r.http?.status == 200)
            #expect(r.value?.at("/version")?.stringValue == "same")
            #expect(r.fromCache == false)
            // The entry went with that answer: the next GET is one request,
            // without validators (each GET was two, for ever: the tenth
            // review's check of its changes).
            let next = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(next.outcome == .succeeded)
            #expect(next.http?.metrics?.at("/attempts")?.integerValue == 1)
            #expect(try validatorsSentToSteps() == ["", #""same""#, "", ""])
        }
        #expect(try serverCount("/steps") == 4)
        #expect(try serverCount("/etag") == 3)
    }

    /// An entry whose URL redirects now, to a target that answers 200: the
    /// entry goes with that answer. (It went on being revalidated, delivered
    /// first by stale-while-revalidate and answering "only-if-cached": the
    /// tenth review's check of its changes.)
    @Test func anEntryWhoseURLRedirectsNowGoes() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = stepsURL("moved-200", #"200;Cache-Control=max-age=0;ETag="v1";body={"v": 1}|302;Location=/cache?max_age=0&key=target-200"#)
            #expect(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))?.value?.at("/v")?.integerValue == 1)
            let moved = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(moved.outcome == .succeeded)
            #expect(moved.value?.at("/key")?.stringValue == "target-200")
            let cached = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#,
                                                                options: #"{"cache": "only-if-cached"}"#, on: queue, c)))
            #expect(cached.status == .cacheMiss, "\(cached.value?.text ?? "no value")")
            let id = try engine.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "stale-while-revalidate"}"#, on: queue, c)
            #expect(c.wait(id)?.value?.at("/key")?.stringValue == "target-200")
            #expect(c.allEvents.filter { $0.id == id && $0.kind == .update }.isEmpty)
            #expect(try validatorsSentToSteps() == ["", #""v1""#, ""])
        }
    }

    /// A newer answer that is not stored (no Cache-Control or Expires) takes
    /// the older entry's place all the same: the entry goes, and the next
    /// plain request asks the server. (It went on answering: the tenth
    /// review.)
    @Test(arguments: [#"{"cache": "reload"}"#, nil])
    func aNewerAnswerNotStoredRemovesTheOlderEntry(options: String?) throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let key = options == nil ? "newer-no-cache" : "newer-reload"
            let url = stepsURL(key, #"200;Cache-Control=max-age=300;body={"v": 1}|200;ETag="v2";body={"v": 2}"#)
            let headers = options == nil ? #"{"Cache-Control": "no-cache"}"# : "{}"
            #expect(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))?.value?.at("/v")?.integerValue == 1)
            let newer = try #require(c.wait(try engine.request(#"{"url": "\#(url)", "headers": \#(headers)}"#,
                                                               options: options, on: queue, c)))
            #expect(newer.value?.at("/v")?.integerValue == 2)
            let plain = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(plain.fromCache == false)
            #expect(plain.value?.at("/v")?.integerValue == 2)
        }
        #expect(try serverCount("/steps") == 3)
    }

    @Test func searchesUseTheSameCache() throws {
        _ = try server.get("/stats/reset")
        let config = #"{"search": {"url": "\#(server.url("/search?q={query}&rpp=500&max_age=60"))", "results": "/results"}}"#
        try withEngine(config) { engine, queue, c in
            let first = try #require(c.wait(try engine.search("swift", on: queue, c)))
            let second = try #require(c.wait(try engine.search("swift", on: queue, c)))
            #expect(second.fromCache == true)
            #expect(second.value?.at("/count")?.integerValue == first.value?.at("/count")?.integerValue)
        }
        #expect(try serverCount("/search") == 1)
    }

    /// A cache mode other than "default" where the cache cannot apply is
    /// refused at submit (nothing is sent, no callback); only-if-cached went
    /// to the server on a request with a body, another method, or an engine
    /// whose cache is off.
    @Test func cacheModesWhereTheCacheCannotApplyAreRefused() throws {
        _ = try server.get("/stats/reset")
        let url = server.url("/cache?max_age=60&key=refused")
        func refusal(_ body: () throws -> OpID) -> String? {
            do {
                _ = try body()
                return nil
            } catch let error as FetchQError {
                return error.status == .invalid ? error.message : "status \(error.status)"
            } catch {
                return "\(error)"
            }
        }
        try withEngine { engine, queue, c in
            for mode in ["only-if-cached", "reload", "stale-while-revalidate"] {
                let post = refusal { try engine.request(#"{"url": "\#(url)", "method": "POST", "body": "x"}"#,
                                                         options: #"{"cache": "\#(mode)"}"#, on: queue, c) }
                #expect(post == "options.cache: \"\(mode)\" applies only to a GET without a body, not to a POST")
                let withBody = refusal { try engine.request(#"{"url": "\#(url)", "body": "x"}"#,
                                                             options: #"{"cache": "\#(mode)"}"#, on: queue, c) }
                #expect(withBody == "options.cache: \"\(mode)\" applies only to a GET without a body, not to a GET with a body")
                #expect(refusal { try engine.request(#"{"url": "\#(url)", "method": "DELETE"}"#,
                                                      options: #"{"cache": "\#(mode)"}"#, on: queue, c) } != nil)
            }
            // "default" stays allowed on any request.
            let post = try engine.request(#"{"url": "\#(url)", "method": "POST", "body": "x"}"#,
                                          options: #"{"cache": "default"}"#, on: queue, c)
            #expect(c.wait(post)?.outcome == .succeeded)
        }
        try withEngine(#"{"cache": {"max_bytes": 0}}"#) { engine, queue, c in
            let get = refusal { try engine.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "only-if-cached"}"#, on: queue, c) }
            #expect(get == #"options.cache: "only-if-cached" needs the engine's HTTP cache, which config "cache" turns off (max_bytes 0)"#)
            // The other modes simply ask the server.
            let reload = try engine.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "reload"}"#, on: queue, c)
            #expect(c.wait(reload)?.outcome == .succeeded)
        }
        #expect(try serverCount("/cache") == 2)  // the two allowed requests, nothing else
    }

    @Test func cacheCanBeTurnedOffAndPersisted() throws {
        _ = try server.get("/stats/reset")
        try withEngine(#"{"cache": {"max_bytes": 0}}"#) { engine, queue, c in
            let url = server.url("/cache?max_age=60&key=off")
            _ = c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))
            #expect(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))?.fromCache == false)
            #expect(engine.stats().at("/cache") == nil)
        }
        var template = Array("/tmp/fetchq-cache-XXXXXX".utf8CString)
        let dir = String(cString: try #require(template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }))
        defer {
            for s in ["", "-wal", "-shm"] { unlink(dir + "/c.db" + s) }
            rmdir(dir)
        }
        let url = server.url("/cache?max_age=60&key=persist")
        for round in 0..<2 {
            try withEngine(#"{"cache": {"path": "\#(dir)/c.db"}}"#) { engine, queue, c in
                let r = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
                #expect(r.fromCache == (round == 1), "round \(round)")
            }
        }
    }

    /// Two engines on one cache file: rows the other engine wrote after this
    /// one opened the file (which a lookup here would load) are removed by a
    /// newer answer without caching headers and by an unsafe request, as
    /// this engine's own are. (Only its own were: the tenth review's check
    /// of its changes.)
    @Test(arguments: ["reload", "POST"])
    func anotherEnginesRowsGoLikeThisOnes(how: String) throws {
        _ = try server.get("/stats/reset")
        try withCacheDirectory { dir in
            let config = #"{"cache": {"path": "\#(dir)/c.db"}}"#
            let url = stepsURL("two-engines-\(how)", #"200;Cache-Control=max-age=100;body={"v": 1}|200;ETag="v2";body={"v": 2}"#)
            try withEngine(config) { a, aQueue, aDone in
                try withEngine(config) { b, bQueue, bDone in  // opened after a: a's index does not have its row
                    let first = try #require(bDone.wait(try b.request(#"{"url": "\#(url)"}"#, on: bQueue, bDone)))
                    #expect(first.value?.at("/v")?.integerValue == 1)
                }
                if how == "reload" {
                    let newer = try #require(aDone.wait(try a.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "reload"}"#,
                                                                      on: aQueue, aDone)))
                    #expect(newer.value?.at("/v")?.integerValue == 2)
                } else {
                    let post = try #require(aDone.wait(try a.request(#"{"url": "\#(url)", "method": "POST", "body": "x"}"#,
                                                                     on: aQueue, aDone)))
                    #expect(post.outcome == .succeeded)
                }
                let cached = try #require(aDone.wait(try a.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "only-if-cached"}"#,
                                                                   on: aQueue, aDone)))
                #expect(cached.status == .cacheMiss, "\(cached.value?.text ?? "no value")")
            }
            try withEngine(config) { c, queue, done in  // and the file has no row left
                let cached = try #require(done.wait(try c.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "only-if-cached"}"#,
                                                                  on: queue, done)))
                #expect(cached.status == .cacheMiss)
            }
        }
    }

    @Test func fetchqLogSelectsTheDefaultLevel() throws {
        // The mapping of FETCHQ_LOG (not setenv: other suites run in parallel).
        #expect(LogLevelName.level(fromEnvironment: "debug") == "debug")
        #expect(LogLevelName.level(fromEnvironment: "TRACE") == "trace")
        #expect(LogLevelName.level(fromEnvironment: "off") == "off")
        #expect(LogLevelName.level(fromEnvironment: "nonsense") == "warning")
        #expect(LogLevelName.level(fromEnvironment: nil) == "warning")
        // An explicit "log" key wins over the environment's default.
        let explicit = json(#"{"log": "error"}"#)
        #expect(try withExtendedLifetime(explicit) { try EngineConfig(json: explicit.pointer) }.log == "error")
    }

    @Test func logLinesReachTheCallbackAtTheConfiguredLevel() throws {
        let lines = Mutex<[String]>([])
        try withEngine(#"{"log": "info"}"#) { engine, queue, c in
            engine.setLogCallback { level, line in lines.withLock { $0.append("\(level) \(line)") } }
            let id = try engine.request(#"{"url": "\#(server.url("/status/503"))"}"#, on: queue, c)
            _ = c.wait(id)
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
        }
        let logged = lines.withLock { $0 }
        #expect(logged.contains { $0.hasPrefix("info operation failed") && $0.contains("status=http") })
        #expect(logged.contains { $0.hasPrefix("info engine shutting down") })
        // Every failure is logged whatever the delivery mode (inline mode
        // returned before its line).
        for mode in ["thread", "inline", "poll"] {
            let failures = Mutex<Int>(0)
            try withEngine(#"{"log": "info", "delivery": "\#(mode)"}"#) { engine, queue, c in
                engine.setLogCallback { _, line in
                    if line.hasPrefix("operation failed") { failures.withLock { $0 += 1 } }
                }
                for _ in 0..<3 {
                    let id = try engine.request(#"{"url": "\#(server.url("/status/503"))"}"#, on: queue, c)
                    if mode == "poll" { _ = engine.waitIdle(timeoutMs: 5000) }
                    _ = c.wait(id)
                }
                #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
            }
            #expect(failures.withLock { $0 } == 3, "\(mode)")
        }
        // Above the level: nothing.
        let quiet = Mutex<Int>(0)
        try withEngine(#"{"log": "error"}"#) { engine, queue, c in
            engine.setLogCallback { _, _ in quiet.withLock { $0 += 1 } }
            _ = c.wait(try engine.request(#"{"url": "\#(server.url("/status/503"))"}"#, on: queue, c))
        }
        #expect(quiet.withLock { $0 } == 0)
        let loud = json(#"{"log": "loud"}"#)
        #expect(throws: FetchQError.self) { _ = try withExtendedLifetime(loud) { try Engine(json: loud.pointer) } }
    }

    /// An entry whose body is exactly `max_response_bytes` long answers a
    /// request with that cap: only a larger body is kept from it.
    @Test func anEntryOfExactlyTheCapAnswersFromTheCache() throws {
        _ = try server.get("/stats/reset")
        let path = "/cache?max_age=60&key=exact"
        let size = try server.get(path).1.count  // the same length with count 2
        try withEngine { engine, queue, c in
            let url = server.url(path)
            let stored = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(stored.outcome == .succeeded)
            #expect(stored.fromCache == false)
            let capped = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#,
                                                                 options: #"{"max_response_bytes": \#(size)}"#, on: queue, c)))
            #expect(capped.outcome == .succeeded)
            #expect(capped.fromCache == true)
            #expect(capped.value?.at("/count")?.integerValue == 2)
        }
        #expect(try serverCount("/cache") == 2)
    }

    /// A redirect (not followed) answering an unsafe request is a non-error
    /// status too (RFC 9111 §4.4: 2xx and 3xx): the URL's entries go.
    @Test func anUnsafeRequestAnsweredWithA3xxInvalidatesItsURL() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            // 1st request: 200, cacheable; the next ones: 303 to /json.
            let spec = URLUtilities.percentEncode("200;Cache-Control=max-age=60;body={}|303;Location=/json;body={}")
            let url = server.url("/steps?key=inv3xx&s=\(spec)")
            let first = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(first.outcome == .succeeded)
            #expect(first.fromCache == false)
            let post = try #require(c.wait(try engine.request(#"{"url": "\#(url)", "method": "POST", "body": "x"}"#,
                                                              options: #"{"max_redirects": 0}"#, on: queue, c)))
            #expect(post.http?.status == 303)
            let again = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(again.fromCache == false)
        }
        #expect(try serverCount("/steps") == 3)
    }
}
