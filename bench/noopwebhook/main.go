// Command noopwebhook is the bench's floor for the admission webhook: a validating webhook in Go's standard
// library that admits every object but one named "bench-webhook-check" (so the bench can see that the API server
// calls it), and reads nothing else of the review. Registered for the same SpecServings in a namespace of its
// own, it shows what calling any webhook costs this API server on this machine, so that what our webhook adds
// can be told apart from what every webhook adds. It is a measuring tool, never deployed.
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"
)

// review holds the only fields the floor reads; encoding/json skips the rest of the object.
type review struct {
	Request struct {
		UID    string `json:"uid"`
		Object struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"object"`
	} `json:"request"`
}

type status struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type response struct {
	UID     string  `json:"uid"`
	Allowed bool    `json:"allowed"`
	Status  *status `json:"status,omitempty"`
}

type answer struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Response   response `json:"response"`
}

// refusedName is the object that wait_webhook in bench/cli.py sends to see the webhook answer.
const refusedName = "bench-webhook-check"

func admit(w http.ResponseWriter, r *http.Request) {
	var in review
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, "not an AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	out := answer{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview",
		Response: response{UID: in.Request.UID, Allowed: true}}
	if in.Request.Object.Metadata.Name == refusedName {
		out.Response.Allowed = false
		out.Response.Status = &status{Code: http.StatusUnprocessableEntity, Message: "refused by the floor webhook"}
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		log.Printf("writing the answer to %s: %v", r.RemoteAddr, err)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address and port to serve HTTPS on")
	cert := flag.String("cert", "", "the serving certificate (PEM)")
	key := flag.String("key", "", "its private key (PEM)")
	flag.Parse()
	if *cert == "" || *key == "" {
		log.Fatal("noopwebhook: -cert and -key are required")
	}
	http.HandleFunc("/", admit)
	log.Printf("noopwebhook: serving on https://%s", *listen)
	log.Fatal(http.ListenAndServeTLS(*listen, *cert, *key, nil))
}
