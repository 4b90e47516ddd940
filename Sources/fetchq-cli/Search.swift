import ArgumentParser
import FetchQ

struct Search: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Search an endpoint for each query, in parallel.",
        discussion: """
            Each QUERY is percent-encoded into the {query} of the --url template; the \
            response is parsed and the array at the --results JSON Pointer is sorted by --sort.

            Without --merged: one line per query, as each finishes: \
            {"query": Q, "count": N, "items": [...]}.

            With --merged: one fan-out operation; one line per item of the merged list \
            (the items of all queries in query order, de-duplicated by --id, sorted by --sort).

            A failed query is reported on stderr and the exit status is 1.

            Examples (test server: python3 Tests/support/testserver.py --port 8000):
              fetchq search --results /results \\
                  --url 'http://127.0.0.1:8000/search?q={query}&rpp=500' swift rust
              fetchq search --results /results --sort /created_at --merged \\
                  --url 'http://127.0.0.1:8000/search?q={query}&rpp=500' swift c go
              fetchq search --results /results --sort /created_at --order asc \\
                  --concurrency 2 --retry 2 \\
                  --url 'http://127.0.0.1:8000/search?q={query}' json http queue
            """)

    enum Order: String, ExpressibleByArgument, CaseIterable {
        case asc, desc
    }

    @Option(help: ArgumentHelp("The endpoint: a URL template containing {query}.", valueName: "template"))
    var url: String

    @Option(help: ArgumentHelp("JSON Pointer to the results array in a response (default \"\": the whole document).",
                               valueName: "pointer"))
    var results: String?

    @Option(help: ArgumentHelp("JSON Pointer to an item's id, for de-duplication with --merged (default /id).",
                               valueName: "pointer"))
    var id: String?

    @Option(help: ArgumentHelp("JSON Pointer to the sort key of an item (default: server order).", valueName: "pointer"))
    var sort: String?

    @Option(help: "Sort order.")
    var order: Order?

    @Flag(help: "Fan out and print the merged, de-duplicated, sorted list: one line per item.")
    var merged = false

    @OptionGroup var common: CommonOptions
    @OptionGroup var input: InputOptions

    @Argument(help: "The queries.")
    var queries: [String] = []

    func validate() throws {
        guard !queries.isEmpty || !input.input.isEmpty else { throw ValidationError("give at least one query") }
    }

    func run() throws {
        let endpoint = JSONRef.object()
        endpoint.set("url", .string(url))
        if let results { endpoint.set("results", .string(results)) }
        if let id { endpoint.set("id", .string(id)) }
        if let sort { endpoint.set("sort", .string(sort)) }
        if let order { endpoint.set("order", .string(order.rawValue)) }
        let queries = try input.all(self.queries, "query")
        if merged {
            try runMerged(endpoint, queries)
        } else {
            try runEach(endpoint, queries)
        }
    }

    /// One search per query; one line per query result.
    private func runEach(_ endpoint: JSONRef, _ queries: [String]) throws {
        let session = try Session(common, search: endpoint)
        session.progress.expect(queries.count)
        let options = session.operationOptions
        var submits: [Submit] = []
        for query in queries {
            let completion: Completion = { result in
                let label = "search \(JSONRef.string(query))"
                guard session.ended(result, label: label), let value = result.value else { return }
                let line = JSONRef.object()
                line.set("query", .string(query))
                line.set("count", value["count"] ?? .integer(0))
                line.set("items", value["items"] ?? .array())
                session.console.result(line)
            }
            submits.append { engine, queue in
                try withExtendedLifetime(options) {
                    try engine.submitSearch(query, to: queue, options: options.pointer, completion: completion)
                }
            }
        }
        try session.run(submits)
    }

    /// One search-all; one line per merged item; failed queries on stderr.
    private func runMerged(_ endpoint: JSONRef, _ queries: [String]) throws {
        var seen = Set<ExactString>()  // by bytes, as the engine does
        let unique = queries.filter { seen.insert(ExactString($0)).inserted }
        // With the bar on, children report as they end (child events).
        let session = try Session(common, search: endpoint, extraOptions: [("child_events", .bool(true))])
        session.progress.expect(unique.count)
        session.interruptNote = "with --merged nothing is printed: the merged list would be incomplete"
        let options = session.operationOptions
        let completion: Completion = { result in
            guard session.ended(result, label: "search", countsInProgress: false),
                  let value = result.value else { return }
            let items = value["items"]?.elements ?? []
            var written = 0
            for item in items {
                if session.isInterrupted { break }  // Ctrl-C while a long list is written
                session.console.result(item)
                written += 1
            }
            // What an interrupt says from now on: the list was written whole,
            // or cut short.
            session.interruptNote = written == items.count ? nil
                : "the merged list on stdout was cut short: \(written) of \(items.count) items"
            for query in unique {
                guard let error = value["queries"]?[query]?["error"]?.stringValue else { continue }
                let label = "search \(JSONRef.string(query))"
                session.failed(label, error)
            }
        }
        try session.run([{ engine, queue in
            try withExtendedLifetime(options) {
                try engine.submitSearchAll(unique, to: queue, options: options.pointer, completion: completion)
            }
        }])
    }
}
