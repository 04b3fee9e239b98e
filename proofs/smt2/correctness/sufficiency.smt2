; placement-logic proof obligation: correctness/sufficiency
; theorem: Correctness
; GI ∧ SC ⇒ equivalence (every update rule U)
;   ∀ U, C (deterministic update and clip rules), ∀ θ, θ_d, θ_o, g*, ĝ_d, ĝ_o, ν*, ν_d, ν_o, f*, f_d, f_o, own_d, rg_d:
;     GI:  (own_d ⇒ ĝ_d = g*) ∧ ĝ_o = g*
;     SC:  θ_d = θ ∧ θ_o = θ ∧ (own_d ⇒ ν_d = ν* ∧ f_d = f*) ∧ ν_o = ν* ∧ f_o = f* ∧ (own_d ∨ rg_d)
;     ⇒ θ'_d = θ'*,  where step(θ, g, ν, f) = if f then θ else U(θ, g, C(ν)),
;     θ'* = step(θ, g*, ν*, f*),  θ'_d = if own_d then step(θ_d, ĝ_d, ν_d, f_d) else if rg_d then step(θ_o, ĝ_o, ν_o, f_o) else θ_d
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun g_star () Real)
(declare-fun g_o () Real)
(declare-fun g_d () Real)
(declare-fun own_d () Bool)
(declare-fun rg_d () Bool)
(declare-fun f_star () Bool)
(declare-fun f_o () Bool)
(declare-fun nu_star () Real)
(declare-fun nu_o () Real)
(declare-fun f_d () Bool)
(declare-fun nu_d () Real)
(declare-fun theta () Real)
(declare-fun theta_o () Real)
(declare-fun theta_d () Real)
(declare-fun U (Real Real Real) Real)
(declare-fun C (Real) Real)
(assert
 (let (($x32 (= g_o g_star)))
 (and (=> own_d (= g_d g_star)) $x32)))
(assert
 (let (($x42 (or own_d rg_d)))
 (let (($x41 (= f_o f_star)))
 (let (($x40 (= nu_o nu_star)))
 (let (($x35 (= theta_o theta)))
 (let (($x34 (= theta_d theta)))
 (and $x34 $x35 (=> own_d (and (= nu_d nu_star) (= f_d f_star))) $x40 $x41 $x42)))))))
(assert
 (let ((?x21 (ite f_star theta (U theta g_star (C nu_star)))))
(let ((?x28 (ite rg_d (ite f_o theta_o (U theta_o g_o (C nu_o))) theta_d)))
(let ((?x29 (ite own_d (ite f_d theta_d (U theta_d g_d (C nu_d))) ?x28)))
(and (distinct ?x29 ?x21) true)))))
(check-sat)
(exit)
