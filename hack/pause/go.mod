module specserving.local/pause

go 1.26
