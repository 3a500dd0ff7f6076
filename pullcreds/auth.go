package pullcreds

// Auth is the credential sent with a pull. Never log it.
type Auth struct {
	Username string
	Password string
}
