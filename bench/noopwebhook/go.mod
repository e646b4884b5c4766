module specserving.local/noopwebhook

go 1.26
